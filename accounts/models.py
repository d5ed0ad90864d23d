"""The user model. Custom from the first migration so later fields need no data migration."""

from __future__ import annotations

from django.contrib.auth.models import AbstractUser
from django.db import models
from django.db.models.functions import Lower


class User(AbstractUser):
    """A person using PAW (Django's user, plus ``token_version``).

    ``token_version`` is carried as a claim in every JWT; bumping it (logout, password
    change) makes every access and refresh token issued before stop working at once.
    """

    token_version = models.PositiveIntegerField(default=0)

    class Meta(AbstractUser.Meta):
        swappable = "AUTH_USER_MODEL"
        constraints = [
            # "Alice" and "alice" are one person, also when both register at once.
            models.UniqueConstraint(Lower("username"), name="username_unique_ignoring_case")
        ]


class PersonalToken(models.Model):
    """A named, long-lived API token of a person, for integrations and notebooks.

    The value (``paw_`` + 43 URL-safe characters, 256 random bits) is shown once, when it
    is made; only its SHA-256 is stored (``token_hash``; a fast hash is enough for a
    random value of that length, as GitHub's and PyPI's tokens do), with the first
    characters kept for display (``prefix``). It authenticates as ``Authorization: Bearer
    paw_…`` on every REST endpoint and on the websocket. It stops working when deleted,
    when it expires, and when the user's ``token_version`` moves past the one it was made
    under (logout of every token, a password change).
    """

    user = models.ForeignKey("accounts.User", on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, help_text="The value's first characters (display).")
    token_hash = models.CharField(max_length=64, unique=True, help_text="SHA-256 hex of the value.")
    token_version = models.PositiveIntegerField(
        help_text="The user's token_version when it was made; revoked once they differ."
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ("-created_at", "-id")
        indexes = [models.Index(fields=("user", "token_version"), name="api_token_user_version")]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"
