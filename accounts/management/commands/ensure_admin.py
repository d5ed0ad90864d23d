"""``manage.py ensure_admin``: create the first administrator if there is none.

The password comes from ``PAW_ADMIN_PASSWORD`` and must pass the password validators;
without it one is generated and printed once (it is not stored anywhere else). The
username is ``PAW_ADMIN_USERNAME`` (``admin`` when unset or empty). Does nothing when any
superuser exists, so ``make run`` can call it on every start. Exits non-zero, saying
what to do, when the password is too weak or a non-administrator already has the name.

What it prints names the way back from a lost password (:func:`lost_password_hint`):
``make changepassword`` (``manage.py changepassword <user>``); ``runpaw`` repeats it at
every start.
"""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError


def lost_password_hint(username: str) -> str:
    """The sentence telling an operator how to set a new password for ``username``."""
    return (
        f"Lost the password of '{username}'? Set a new one with `make changepassword"
        f"{'' if username == 'admin' else f' ADMIN_USER={username}'}` "
        f"(that is `manage.py changepassword {username}` with make run's settings)."
    )


class Command(BaseCommand):
    help = "Create an administrator account if none exists."

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            return
        username = os.environ.get("PAW_ADMIN_USERNAME", "").strip() or "admin"
        if User.objects.filter(username=username).exists():
            raise CommandError(
                f"A user named '{username}' exists but is not an administrator: set "
                "PAW_ADMIN_USERNAME to another name, or make that user a superuser."
            )
        password = os.environ.get("PAW_ADMIN_PASSWORD", "")
        generated = not password
        if generated:
            password = secrets.token_urlsafe(12)
        else:
            try:
                validate_password(password, user=User(username=username))
            except ValidationError as exc:
                raise CommandError(
                    f"PAW_ADMIN_PASSWORD is too weak: {' '.join(exc.messages)} "
                    "Choose a stronger one, or unset it to have one generated."
                ) from None
        User.objects.create_superuser(username=username, email="", password=password)
        if generated:
            self.stdout.write(
                self.style.WARNING(
                    f"Created the administrator '{username}' with password: {password}\n"
                    "  This is shown once. Change it at /admin/password_change/.\n"
                    f"  {lost_password_hint(username)}"
                )
            )
        else:
            self.stdout.write(
                f"Created the administrator '{username}' (password from PAW_ADMIN_PASSWORD).\n"
                f"  {lost_password_hint(username)}"
            )
