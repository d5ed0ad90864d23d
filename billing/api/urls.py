"""Billing routes under ``/api/`` (included by ``paw_project.urls``)."""

from __future__ import annotations

from django.urls import path

from billing.api import usage

urlpatterns = [
    path("usage", usage.UsageApi.as_view(), name="api-usage"),
]
