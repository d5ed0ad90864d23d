"""The encrypted field that holds secret values.

Built on django-fernet-encrypted-fields' ``EncryptedTextField``: values are Fernet tokens
(AES-128-CBC + HMAC-SHA256) under keys derived with PBKDF2-SHA256 (100,000 rounds) from
every ``SECRET_KEY`` / ``SECRET_KEY_FALLBACKS`` entry and every ``SALT_KEY`` salt
(``PAW_SALT_KEYS``). New values are encrypted under the first pair (the newest key and
salt); all pairs can decrypt, which is what makes a key rotation possible.

Three things differ from the library's field, all for safety:

* a value that no configured key can decrypt is read as :data:`UNDECRYPTABLE` (the
  library hands back the raw token as if it were the value), and such a marker can never
  be written back over the stored token;
* ``value_to_string`` (``dumpdata``, serializers) gives the token, never the plaintext;
* no per-field "already decrypted" flag (the library's is shared by all threads).

The derived keys are cached per field instance; they are recomputed when a test changes
``SECRET_KEY``, ``SECRET_KEY_FALLBACKS`` or ``SALT_KEY`` (``setting_changed``).
"""

from __future__ import annotations

import weakref
from typing import Any

from cryptography.fernet import InvalidToken
from django.core.signals import setting_changed
from django.db import models
from django.dispatch import receiver
from encrypted_fields.fields import EncryptedTextField


class _Undecryptable:
    """The type of :data:`UNDECRYPTABLE`: not a string, so it cannot be mistaken for one."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<undecryptable secret value>"

    def __bool__(self) -> bool:
        return False


#: What a stored value reads as when no configured key decrypts it (the key it was
#: encrypted under was removed from ``PAW_SECRET_KEY_FALLBACKS`` / ``PAW_SALT_KEYS``).
UNDECRYPTABLE = _Undecryptable()

_instances: weakref.WeakSet[EncryptedSecretField] = weakref.WeakSet()


class EncryptedSecretField(EncryptedTextField):
    """A text field stored as a Fernet token; Python values are always plaintext ``str``
    (or :data:`UNDECRYPTABLE`). Empty values are stored as NULL by the library: give the
    field ``null=True`` only if "no value" is meaningful."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        _instances.add(self)

    def from_db_value(self, value: Any, expression: Any, connection: Any) -> Any:
        if value is None:
            return None
        try:
            return self.f.decrypt(value.encode("utf-8")).decode("utf-8")
        except (InvalidToken, UnicodeError, AttributeError):
            return UNDECRYPTABLE

    def to_python(self, value: Any) -> Any:
        """Plaintext stays as is; a token this server can decrypt (``loaddata``) is
        decrypted."""
        if isinstance(value, str):
            try:
                return self.f.decrypt(value.encode("utf-8")).decode("utf-8")
            except (InvalidToken, UnicodeError):
                return value
        return value

    def clean(self, value: Any, model_instance: models.Model | None) -> Any:
        return models.TextField.clean(self, value, model_instance)

    def get_prep_value(self, value: Any) -> Any:
        if value is UNDECRYPTABLE:
            raise ValueError("refusing to save an undecryptable secret value: set the secret again")
        return super().get_prep_value(value)

    def value_to_string(self, obj: models.Model) -> str | None:
        value = self.value_from_object(obj)
        return None if value in (None, "") else self.get_prep_value(value)

    def forget_keys(self) -> None:
        """Drop the cached derived keys (they are derived again on next use)."""
        self.__dict__.pop("keys", None)
        self.__dict__.pop("f", None)


@receiver(setting_changed)
def _forget_keys_on_key_change(*, setting: str, **kwargs: Any) -> None:
    if setting in {"SECRET_KEY", "SECRET_KEY_FALLBACKS", "SALT_KEY"}:
        for field in list(_instances):
            field.forget_keys()
