"""Auth API routes, under ``/api/auth/``."""

from __future__ import annotations

from django.urls import path

from accounts.api import views

urlpatterns = [
    path("register", views.RegisterApi.as_view(), name="api-auth-register"),
    path("token", views.TokenApi.as_view(), name="api-auth-token"),
    path("token/refresh", views.TokenRefreshApi.as_view(), name="api-auth-token-refresh"),
    path("logout", views.LogoutApi.as_view(), name="api-auth-logout"),
    path("password", views.PasswordChangeApi.as_view(), name="api-auth-password"),
    path("me", views.MeApi.as_view(), name="api-auth-me"),
    path("tokens", views.PersonalTokenListApi.as_view(), name="api-auth-tokens"),
    path(
        "tokens/<int:token_id>",
        views.PersonalTokenDetailApi.as_view(),
        name="api-auth-token-detail",
    ),
]
