"""``{secret:NAME}`` placeholders: finding and substituting them in JSON-like values.

Pure functions; looking the values up is ``services.placeholders_resolve``. Substitution
is one pass over the original strings: a secret value that itself contains
``{secret:OTHER}`` is inserted as is, never expanded (no secret can pull in another).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

PLACEHOLDER = re.compile(r"\{secret:([A-Z][A-Z0-9_]{0,63})\}")
_WHOLE = re.compile(r"^\{secret:([A-Z][A-Z0-9_]{0,63})\}$")


def placeholder_names(obj: Any) -> list[str]:
    """The secret names referenced anywhere in ``obj`` (strings, dict values, lists,
    recursively; dict keys are not looked at), each once, in order of appearance."""
    found: dict[str, None] = {}

    def walk(value: Any) -> None:
        if isinstance(value, str):
            for match in PLACEHOLDER.finditer(value):
                found.setdefault(match.group(1), None)
        elif isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list | tuple):
            for item in value:
                walk(item)

    walk(obj)
    return list(found)


def placeholders_substitute(obj: Any, values: Mapping[str, str]) -> Any:
    """A copy of ``obj`` with every ``{secret:NAME}`` replaced by ``values[NAME]``.

    Raises ``KeyError`` naming the first placeholder without a value; callers check
    :func:`placeholder_names` against what they found first.
    """
    if isinstance(obj, str):
        return PLACEHOLDER.sub(lambda match: values[match.group(1)], obj)
    if isinstance(obj, dict):
        return {key: placeholders_substitute(item, values) for key, item in obj.items()}
    if isinstance(obj, list | tuple):
        return [placeholders_substitute(item, values) for item in obj]
    return obj


def placeholder_whole(value: Any) -> str | None:
    """The NAME when ``value`` is exactly one ``{secret:NAME}`` and nothing else."""
    if isinstance(value, str):
        match = _WHOLE.match(value)
        if match:
            return match.group(1)
    return None
