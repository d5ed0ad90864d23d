from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Users, registration and the JWT auth API."""

    name = "accounts"
