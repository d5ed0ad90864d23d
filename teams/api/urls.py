"""Team routes under ``/api/`` (included by ``paw_project.urls``)."""

from __future__ import annotations

from django.urls import path

from teams.api import views

urlpatterns = [
    path("admin/teams", views.AdminTeamListApi.as_view(), name="admin-team-list"),
    path("admin/teams/<int:team_id>", views.AdminTeamDetailApi.as_view(), name="admin-team-detail"),
]
