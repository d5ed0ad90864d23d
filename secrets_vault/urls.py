"""Page routes of the secrets vault (included by ``paw_project.urls``)."""

from __future__ import annotations

from django.urls import path

from secrets_vault import views

urlpatterns = [
    path("settings/keys/", views.keys_page, name="keys"),
]
