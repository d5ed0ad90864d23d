"""``manage.py secrets_reencrypt``: rewrite every secret value under the newest key."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from secrets_vault.services import secrets_reencrypt


class Command(BaseCommand):
    help = (
        "Re-encrypt every secret under the newest key (PAW_SECRET_KEY with the first of "
        "PAW_SALT_KEYS), so older keys can be dropped from PAW_SECRET_KEY_FALLBACKS / "
        "PAW_SALT_KEYS. Fails (exit 1) listing the secrets no configured key can open."
    )

    def handle(self, *args: Any, **options: Any) -> None:
        result = secrets_reencrypt()
        self.stdout.write(f"Re-encrypted {result.rewritten} secret(s) under the newest key.")
        if result.undecryptable:
            raise CommandError(
                "These secrets cannot be decrypted with the configured keys and were left "
                "as they are (add the old key back to PAW_SECRET_KEY_FALLBACKS / "
                f"PAW_SALT_KEYS, or set them again): {', '.join(result.undecryptable)}"
            )
