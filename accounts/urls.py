"""Page routes of accounts, under ``/accounts/``."""

from __future__ import annotations

from django.urls import path

from accounts import views

urlpatterns = [
    path("login/", views.LoginPage.as_view(), name="login"),
    path("logout/", views.LogoutPage.as_view(), name="logout"),
    path("register/", views.register_page, name="register"),
]
