"""The audit's routes under ``/api/`` (included by ``paw_project.urls``)."""

from __future__ import annotations

from django.urls import path

from audit.api import views

urlpatterns = [
    path("admin/audit", views.AuditListApi.as_view(), name="admin-audit-list"),
]
