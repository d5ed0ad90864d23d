"""``manage.py secret set|delete|list``: secrets from the command line.

A value is read from standard input (a pipe, a file, or typed without echo at a
terminal), never from the arguments, which other users can see in the process list
and which shells keep in their history.
"""

from __future__ import annotations

import getpass
import sys
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from paw_project.errors import DomainError
from secrets_vault.selectors import secret_get, secret_list, secret_list_all
from secrets_vault.services import secret_delete, secret_set


class Command(BaseCommand):
    help = (
        "Manage secrets. `secret set NAME [--user USERNAME]` reads the value from stdin "
        "(one trailing newline removed); without --user the secret is global. "
        "`secret delete NAME [--user USERNAME]`; `secret list [--user USERNAME]` shows "
        "names and dates, never values."
    )

    # call_command(..., stdin=io.StringIO(...)) in tests, like createsuperuser.
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        actions = parser.add_subparsers(dest="action", required=True)
        set_ = actions.add_parser("set", help="create or replace a secret (value from stdin)")
        set_.add_argument("name")
        set_.add_argument("--user", help="the owner's username (default: a global secret)")
        set_.add_argument("--description", default=None)
        delete = actions.add_parser("delete", help="delete a secret")
        delete.add_argument("name")
        delete.add_argument("--user", help="the owner's username (default: the global one)")
        list_ = actions.add_parser("list", help="list secrets (names and dates only)")
        list_.add_argument("--user", help="only this user's secrets")

    def handle(self, *args: Any, action: str, **options: Any) -> None:
        self.stdin = options.get("stdin") or sys.stdin
        user = self._user(options.get("user"))
        try:
            if action == "set":
                self._set(options["name"], user, options.get("description"))
            elif action == "delete":
                self._delete(options["name"], user)
            else:
                self._list(user)
        except DomainError as error:
            raise CommandError(error.detail) from None

    def _user(self, username: str | None):
        if not username:
            return None
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"No user named {username!r}.")
        return user

    def _read_value(self) -> str:
        if self.stdin.isatty():
            return getpass.getpass("Value (not echoed): ")
        value = self.stdin.read()
        return value[:-1] if value.endswith("\n") else value

    def _set(self, name: str, user, description: str | None) -> None:
        value = self._read_value()
        if not value:
            raise CommandError('No value on standard input (e.g. `printf %s "$KEY" | ...`).')
        secret, created = secret_set(name=name, value=value, user=user, description=description)
        where = f"user {user.username}" if user else "global"
        self.stdout.write(f"{'Created' if created else 'Updated'} secret {secret.name} ({where}).")

    def _delete(self, name: str, user) -> None:
        secret = secret_get(name=name, user=user)
        where = f"user {user.username}" if user else "global"
        if secret is None:
            raise CommandError(f"No secret {name} ({where}).")
        secret_delete(secret=secret)
        self.stdout.write(f"Deleted secret {name} ({where}).")

    def _list(self, user) -> None:
        secrets = secret_list(user=user) if user else secret_list_all()
        for secret in secrets:
            owner = secret.owner.username if secret.owner_id else "-"
            used = secret.last_used_at.isoformat(timespec="seconds") if secret.last_used_at else "-"
            self.stdout.write(
                f"{secret.name}\t{secret.scope}\t{owner}\t"
                f"updated {secret.updated_at.isoformat(timespec='seconds')}\tused {used}"
            )
