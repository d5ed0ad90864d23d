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
