"""Masking of secret values in what PAW stores, sends and logs."""

from __future__ import annotations

from typing import Any

#: Values shorter than this are not masked: replacing "1" or "abc" everywhere would
#: mangle ordinary text and reveal nothing worth hiding.
MIN_MASKED_LENGTH = 4


def mask_secrets(value: Any, secret_values: dict[str, str]) -> Any:
    """A copy of ``value`` (str, or dicts/lists of them, nested) with every occurrence of
    each secret value replaced by ``[secret:NAME]``. Longer values are replaced first, so a
    value containing another is masked whole. Keys of dicts are masked too; other types
    are returned as they are."""
    pairs = sorted(
        (
            (secret, name)
            for name, secret in secret_values.items()
            if secret and len(secret) >= MIN_MASKED_LENGTH
        ),
        key=lambda pair: len(pair[0]),
        reverse=True,
    )
    if not pairs:
        return value
    return _mask(value, pairs)


def _mask(value: Any, pairs: list[tuple[str, str]]) -> Any:
    if isinstance(value, str):
        for secret, name in pairs:
            if secret in value:
                value = value.replace(secret, f"[secret:{name}]")
        return value
    if isinstance(value, dict):
        return {_mask(k, pairs): _mask(v, pairs) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_mask(item, pairs) for item in value]
    return value
