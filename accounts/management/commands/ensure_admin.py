"""``manage.py ensure_admin``: create the first administrator if there is none.

The password comes from ``PAW_ADMIN_PASSWORD``; without it one is generated and printed
once (it is not stored anywhere else). The username is ``PAW_ADMIN_USERNAME`` (``admin``).
Does nothing when any superuser exists, so ``make run`` can call it on every start.
"""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create an administrator account if none exists."

    def handle(self, *args, **options) -> None:
        User = get_user_model()
        if User.objects.filter(is_superuser=True).exists():
            return
        username = os.environ.get("PAW_ADMIN_USERNAME", "admin")
        password = os.environ.get("PAW_ADMIN_PASSWORD", "")
        generated = not password
        if generated:
            password = secrets.token_urlsafe(12)
        User.objects.create_superuser(username=username, email="", password=password)
        if generated:
            self.stdout.write(
                self.style.WARNING(
                    f"Created the administrator '{username}' with password: {password}\n"
                    "  This is shown once. Change it at /admin/password_change/."
                )
            )
        else:
            self.stdout.write(
                f"Created the administrator '{username}' (password from PAW_ADMIN_PASSWORD)."
            )
