"""Masking of secret values: in events, answers, errors and log lines.

Every secret value handed to a sandbox (its owner's secrets, the provider key, the
datasource passwords and URLs) is known by name to the code that handed it out; whatever
PAW stores or sends afterwards goes through :func:`mask_secrets`, which replaces each
occurrence of a value by ``[secret:NAME]`` — also inside longer text, so a value the agent
prints is masked too.

Values shorter than :data:`MIN_MASKED_LENGTH` characters are not masked: a 1-3 character
"secret" (``"1"``, ``"yes"``) would turn every number and word containing it into noise,
and such a value protects nothing anyway.

Imports nothing from Django: the logging configuration loads :class:`SecretMaskingFilter`
before the apps are ready.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Mapping
from typing import Any

#: Values shorter than this many characters are left alone (see the module docstring).
MIN_MASKED_LENGTH = 4
#: Log lines are shared by every user of the server: there, only values that look like
#: credentials are masked (at least this long, no white space, two kinds of characters),
#: so that nobody blanks others' log lines by saving "127.0.0.1" or "alice" as a secret.
#: Events and answers of one's own runs mask every value.
LOG_MASK_MIN_LENGTH = 12


def mask_text(text: str, secret_values: Mapping[str, str]) -> str:
    """``text`` with every occurrence of each value of ``secret_values`` (``NAME → value``)
    replaced by ``[secret:NAME]``, longest values first (so a value containing another is
    masked whole). Values under :data:`MIN_MASKED_LENGTH` characters are ignored."""
    return _matcher(_key(secret_values)).mask(text)


def mask_secrets(obj: Any, secret_values: Mapping[str, str]) -> Any:
    """A copy of the JSON-like ``obj`` (dicts, lists, tuples, strings; other scalars
    unchanged) with every secret value replaced by ``[secret:NAME]`` in every string,
    dict keys included. ``secret_values`` maps ``NAME → value`` (as in
    ``SandboxEnvironment.secret_values``); when one value has several names, the first
    name in the mapping's order is shown. Never mutates ``obj``."""
    matcher = _matcher(_key(secret_values))
    if not matcher.values:
        return _copy(obj)
    text = matcher.mask

    def walk(value: Any) -> Any:
        if isinstance(value, str):
            return text(value)
        if isinstance(value, dict):
            return {
                (text(key) if isinstance(key, str) else key): walk(item)
                for key, item in value.items()
            }
        if isinstance(value, list | tuple):
            return [walk(item) for item in value]
        return value

    return walk(obj)


def _copy(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {key: _copy(item) for key, item in obj.items()}
    if isinstance(obj, list | tuple):
        return [_copy(item) for item in obj]
    return obj


def _key(secret_values: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A hashable, order-preserving form of the mapping (for the matcher cache)."""
    return tuple(
        (name, value)
        for name, value in secret_values.items()
        if isinstance(value, str) and len(value) >= MIN_MASKED_LENGTH
    )


class _Matcher:
    """Finds secret values in text with ``str.find`` (C speed, nothing to compile: a
    regex alternation of many long values took minutes to build). ``matches(text)`` gives
    the non-overlapping occurrences, leftmost first and, at one position, the longest
    value: what a ``longest|shorter`` alternation would match."""

    def __init__(self, items: tuple[tuple[str, str], ...]) -> None:
        self.names: dict[str, str] = {}
        for name, value in items:
            self.names.setdefault(value, name)
        self.values = sorted(self.names, key=len, reverse=True)

    def matches(self, text: str) -> list[tuple[int, int, str]]:
        """``[(start, end, name)]`` of the values in ``text``, in order, not overlapping."""
        found = []
        for value in self.values:
            start = text.find(value)
            while start != -1:
                found.append((start, start + len(value), value))
                start = text.find(value, start + 1)
        if not found:
            return []
        found.sort(key=lambda item: (item[0], item[0] - item[1]))  # leftmost, then longest
        chosen, reach = [], 0
        for start, end, value in found:
            if start >= reach:
                chosen.append((start, end, self.names[value]))
                reach = end
        return chosen

    def mask(self, text: str) -> str:
        if not self.values or not text:
            return text
        pieces, at = [], 0
        for start, end, name in self.matches(text):
            pieces += [text[at:start], f"[secret:{name}]"]
            at = end
        return "".join(pieces) + text[at:] if pieces else text


@functools.lru_cache(maxsize=128)
def _matcher(items: tuple[tuple[str, str], ...]) -> _Matcher:
    return _Matcher(items)


class StreamMasker:
    """Masks text that arrives in pieces (``delta`` lines), where a secret value may be
    split across two pieces and so escape :func:`mask_text` applied to each piece.

    :meth:`feed` returns the masked text that is safe to send now and holds back the
    shortest tail that could still be the start of a secret value (never more than the
    longest value's length minus one characters); :meth:`flush` returns the rest at the
    end of the stream (the run's ``result``). The output, concatenated, equals
    ``mask_text`` of the whole stream. One instance per stream; not thread-safe.
    """

    def __init__(self, secret_values: Mapping[str, str]) -> None:
        self._secret_values = dict(secret_values)
        self._matcher = _matcher(_key(self._secret_values))
        self._values = sorted({v for _, v in _key(self._secret_values)}, key=len)
        self._pending = ""

    def feed(self, text: str) -> str:
        """The masked text that can be sent now (possibly "")."""
        buffer = self._pending + text
        if not self._matcher.values:
            return buffer
        cut = len(buffer) - self._held_length(buffer)
        for start, end, _ in self._matcher.matches(buffer):
            if start < cut < end:
                cut = end  # never split a whole value: it is masked whole
        self._pending = buffer[cut:]
        return mask_text(buffer[:cut], self._secret_values)

    def flush(self) -> str:
        """Whatever is still held back, masked; the stream is then empty."""
        rest, self._pending = self._pending, ""
        return mask_text(rest, self._secret_values)

    def _held_length(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that is a proper prefix of a value."""
        longest = 0
        for value in self._values:
            for length in range(min(len(value) - 1, len(buffer)), longest, -1):
                if buffer.endswith(value[:length]):
                    longest = length
                    break
        return longest


# --- Log lines --------------------------------------------------------------------------

_known_lock = threading.Lock()
_known: dict[str, str] = {}
# The credential-like part of _known, decided once per value (value → name).
_known_for_logs: dict[str, str] = {}


def secret_values_register(secret_values: Mapping[str, str]) -> None:
    """Remember ``NAME → value`` pairs for :class:`SecretMaskingFilter` in this process.

    Called whenever secret values are handed out (a sandbox environment, a provider key,
    a datasource connection test). Values stay known for the life of the process:
    masking a value that was since changed is harmless, and the set is bounded by the
    number of distinct secrets.
    """
    with _known_lock:
        for name, value in secret_values.items():
            if isinstance(value, str) and len(value) >= MIN_MASKED_LENGTH:
                _known.setdefault(value, name)
                if looks_like_a_credential(value):
                    _known_for_logs.setdefault(value, name)


def secret_values_known() -> dict[str, str]:
    """A snapshot of the registered pairs, ``NAME → value``."""
    with _known_lock:
        return {name: value for value, name in _known.items()}


def looks_like_a_credential(value: str) -> bool:
    """Whether ``value`` is masked in log lines (see :data:`LOG_MASK_MIN_LENGTH`): at least
    that long, no white space, and at least two of lower-case letters, upper-case
    letters, digits and other characters."""
    if len(value) < LOG_MASK_MIN_LENGTH or any(c.isspace() for c in value):
        return False
    kinds = (str.islower, str.isupper, str.isdigit)
    found = sum(any(test(c) for c in value) for test in kinds)
    found += any(not c.isalnum() for c in value)
    return found >= 2


class SecretMaskingFilter(logging.Filter):
    """A logging filter that masks the registered secret values (see
    :func:`secret_values_register`) that look like credentials
    (:func:`looks_like_a_credential`) in a record's message, arguments and exception text.

    Put it on the handlers (``LOGGING["handlers"][...]["filters"]``), so records of every
    logger pass through it. Never drops a record.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        with _known_lock:
            known = {name: value for value, name in _known_for_logs.items()}
        if not known:
            return True
        try:
            message = record.getMessage()
        except Exception:  # a malformed call: let the handler report it, as logging does
            return True
        masked = mask_text(message, known)
        if masked != message:
            record.msg, record.args = masked, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            masked = mask_text(record.exc_text, known)
            if masked != record.exc_text:
                # Formatters (text and JSON) print exc_text when exc_info is gone; with
                # exc_info kept, the JSON one would format the traceback afresh.
                record.exc_text, record.exc_info = masked, None
        if record.stack_info:
            record.stack_info = mask_text(record.stack_info, known)
        return True
