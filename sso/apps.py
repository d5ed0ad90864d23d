from django.apps import AppConfig


class SsoConfig(AppConfig):
    """Single sign-on with an OpenID Connect provider (mozilla-django-oidc, plus discovery,
    ID token checks and identities linked by subject)."""

    name = "sso"
    verbose_name = "Single sign-on"
