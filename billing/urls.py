"""Page routes of billing (included by ``paw_project.urls``)."""

from __future__ import annotations

from django.urls import path

from billing import views

urlpatterns = [
    path("usage/", views.usage_page, name="usage"),
]
