"""Billing routes under ``/api/`` (included by ``paw_project.urls``)."""

from __future__ import annotations

from django.urls import path

from billing.api import team_budgets, usage

urlpatterns = [
    path("usage", usage.UsageApi.as_view(), name="api-usage"),
    path(
        "admin/teams/<int:team_id>/budget",
        team_budgets.AdminTeamBudgetApi.as_view(),
        name="admin-team-budget",
    ),
]
