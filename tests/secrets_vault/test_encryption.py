"""Secrets are encrypted at rest, readable across a key rotation, and re-encrypted under
the newest key by `manage.py secrets_reencrypt`."""

from __future__ import annotations

import base64
import io

import pytest
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.pbkdf2 import PBKDF2HMAC
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import override_settings

from secrets_vault.fields import UNDECRYPTABLE
from secrets_vault.models import Secret
from secrets_vault.services import secret_set, secret_update
from tests.secrets_vault.conftest import secret_value

KEY_A = "old-secret-key-" + "a" * 40
KEY_B = "new-secret-key-" + "b" * 40


def raw_value(secret_id: int) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT value FROM secrets_vault_secret WHERE id = %s", [secret_id])
        return cursor.fetchone()[0]


def fernet(secret_key: str, salt: str) -> Fernet:
    """The Fernet key django-fernet-encrypted-fields derives from one (key, salt) pair."""
    kdf = PBKDF2HMAC(algorithm=hashes.SHA256(), length=32, salt=salt.encode(), iterations=100_000)
    return Fernet(base64.urlsafe_b64encode(kdf.derive(secret_key.encode())))


def stored_value(secret_id: int):
    return Secret.objects.get(pk=secret_id).value


def test_the_database_column_never_holds_the_plaintext(alice):
    value = secret_value("at-rest")
    secret, _ = secret_set(name="AT_REST", value=value, user=alice)
    raw = raw_value(secret.pk)
    assert value not in raw
    assert raw.startswith("gAAAAA"), "a Fernet token"
    assert stored_value(secret.pk) == value
    # Same value again: a fresh token (random IV), so equal values cannot be spotted.
    secret_update(secret=secret, value=value)
    assert raw_value(secret.pk) != raw


@override_settings(SECRET_KEY=KEY_A, SECRET_KEY_FALLBACKS=[], SALT_KEY=["salt-1"])
def test_a_rotated_key_still_reads_and_reencrypt_moves_every_value_to_the_newest_key(alice):
    value_user, value_global = secret_value("rot-u"), secret_value("rot-g")
    user_secret, _ = secret_set(name="ROTATE_ME", value=value_user, user=alice)
    global_secret, _ = secret_set(name="ROTATE_ME", value=value_global)
    before = raw_value(user_secret.pk)
    assert fernet(KEY_A, "salt-1").decrypt(before.encode()).decode() == value_user

    with override_settings(SECRET_KEY=KEY_B, SECRET_KEY_FALLBACKS=[KEY_A]):
        assert stored_value(user_secret.pk) == value_user, "readable via the fallback key"
        out = io.StringIO()
        call_command("secrets_reencrypt", stdout=out)
        assert "Re-encrypted 2 secret(s)" in out.getvalue()
        after = raw_value(user_secret.pk)
        assert after != before and value_user not in after
        assert fernet(KEY_B, "salt-1").decrypt(after.encode()).decode() == value_user
        with pytest.raises(InvalidToken):
            fernet(KEY_A, "salt-1").decrypt(after.encode())

    with override_settings(SECRET_KEY=KEY_B, SECRET_KEY_FALLBACKS=[]):
        assert stored_value(user_secret.pk) == value_user, "the old key is no longer needed"
        assert stored_value(global_secret.pk) == value_global


@override_settings(SECRET_KEY=KEY_A, SECRET_KEY_FALLBACKS=[], SALT_KEY=["salt-1"])
def test_a_new_salt_comes_first_and_reencrypt_moves_values_to_it(alice):
    value = secret_value("salt")
    secret, _ = secret_set(name="SALTED", value=value, user=alice)
    with override_settings(SALT_KEY=["salt-2", "salt-1"]):
        assert stored_value(secret.pk) == value
        call_command("secrets_reencrypt", stdout=io.StringIO())
        assert fernet(KEY_A, "salt-2").decrypt(raw_value(secret.pk).encode()).decode() == value
    with override_settings(SALT_KEY=["salt-2"]):
        assert stored_value(secret.pk) == value


@override_settings(SECRET_KEY=KEY_A, SECRET_KEY_FALLBACKS=[])
def test_a_value_no_key_opens_reads_as_undecryptable_and_is_never_overwritten(alice):
    secret, _ = secret_set(name="LOST_KEY", value=secret_value("lost"), user=alice)
    raw = raw_value(secret.pk)
    with override_settings(SECRET_KEY=KEY_B):
        assert stored_value(secret.pk) is UNDECRYPTABLE
        with pytest.raises(CommandError, match="LOST_KEY \\(user alice\\)"):
            call_command("secrets_reencrypt", stdout=io.StringIO())
        # Changing the description keeps the stored token as it is.
        secret_update(secret=Secret.objects.defer("value").get(pk=secret.pk), description="x")
        assert raw_value(secret.pk) == raw
        loaded = Secret.objects.get(pk=secret.pk)
        with pytest.raises(ValueError, match="undecryptable"), transaction.atomic():
            loaded.save()
    assert raw_value(secret.pk) == raw


def test_dumpdata_writes_tokens_never_plaintext(alice):
    value = secret_value("dump")
    secret_set(name="DUMPED", value=value, user=alice)
    out = io.StringIO()
    call_command("dumpdata", "secrets_vault.secret", stdout=out)
    assert "DUMPED" in out.getvalue()
    assert value not in out.getvalue()
