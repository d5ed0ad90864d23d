"""Routes of single sign-on, under ``/accounts/sso/`` (the callback is the redirect URI
to register at the provider)."""

from __future__ import annotations

from django.urls import path

from sso import views

urlpatterns = [
    path("start/", views.SsoStart.as_view(), name="sso_start"),
    path("callback/", views.SsoCallback.as_view(), name="sso_callback"),
]
