from django.apps import AppConfig


class AccountsConfig(AppConfig):
    """Users, registration and the JWT auth API."""

    name = "accounts"

    def ready(self) -> None:
        # Registers the OpenAPI extension for PAW's JWT authentication.
        from accounts import schema  # noqa: F401
