"""Masking of secret values: in events, answers, errors and log lines.

Every secret value handed to a sandbox (its owner's secrets, the provider key, the
datasource passwords and URLs) is known by name to the code that handed it out; whatever
PAW stores or sends afterwards goes through :func:`mask_secrets`, which replaces each
occurrence of a value by ``[secret:NAME]`` — also inside longer text, so a value the agent
prints is masked too.

The forms a curious model or a careless script prints a value in are masked as well, each
as ``[secret:NAME]`` (:func:`secret_forms`): reversed; Base64, standard and URL-safe, with
and without padding; hexadecimal, lower and upper case; percent-encoded (Python's
``quote`` and ``quote_plus``, JavaScript's ``encodeURIComponent`` and ``encodeURI``, with
upper- or lower-case escapes); escaped as inside a quoted string (JSON, ASCII-escaped or
not, and Python's ``repr``: ``print(os.environ)``). A value inside a longer Base64 text (``user:password`` of a Basic
``Authorization`` header, a JSON document) is encoded in one of three ways depending on
its offset modulo 3; for each, the characters that come from the value alone are masked,
so at most the one or two characters at either end, which it shares with its neighbours
(at most 4 bits of it each), stay. Not covered: other encodings and combinations (Base32,
Base64 of the reversed value, a hex dump with spaces, mixed-case hex, Base64 cut into
lines), and pieces of a value; masking is a net for what is printed carelessly, not a
wall against a runtime that holds the values (the sandbox must have them to use them).
Forms shorter than :data:`MIN_FORM_LENGTH` characters are left alone, and values longer
than :data:`MAX_FORM_SOURCE_LENGTH` characters are masked as they are only.

Values shorter than :data:`MIN_MASKED_LENGTH` characters are not masked: a 1-3 character
"secret" (``"1"``, ``"yes"``) would turn every number and word containing it into noise,
and such a value protects nothing anyway.

Imports nothing from Django: the logging configuration loads :class:`SecretMaskingFilter`
before the apps are ready.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import quote, quote_plus

from ahocorasick_rs import AhoCorasick, MatchKind

#: Values shorter than this many characters are left alone (see the module docstring).
MIN_MASKED_LENGTH = 4
#: Encoded or reversed forms (:func:`secret_forms`) shorter than this many characters are
#: left alone: the reverse of "stop" is the word "pots", and a Base64 piece of four
#: characters turns up in any long identifier.
MIN_FORM_LENGTH = 8
#: Values longer than this many characters are masked as they are, without their forms:
#: each form costs about the value's size again, and a matcher holds some 15 of them.
MAX_FORM_SOURCE_LENGTH = 4096
#: Values and forms up to this many characters are found by the matcher's automaton,
#: longer ones by ``str.find`` (see :class:`_Matcher`).
AUTOMATON_MAX_CHARS = 512
#: Log lines are shared by every user of the server: there, only values that look like
#: credentials are masked (at least this long, no white space, two kinds of characters),
#: so that nobody blanks others' log lines by saving "127.0.0.1" or "alice" as a secret.
#: Events and answers of one's own runs mask every value.
LOG_MASK_MIN_LENGTH = 12


def secret_forms(value: str) -> list[str]:
    """The forms of ``value`` masked besides the value itself (see the module docstring),
    each at least :data:`MIN_FORM_LENGTH` characters and different from ``value``; none
    for a value over :data:`MAX_FORM_SOURCE_LENGTH` characters. Bytes are UTF-8."""
    return list(_forms(value))


@functools.lru_cache(maxsize=4096)
def _forms(value: str) -> tuple[str, ...]:
    # Cached: the log filter's matcher is built anew whenever a value is registered.
    if len(value) > MAX_FORM_SOURCE_LENGTH:
        return ()
    raw = value.encode("utf-8")
    forms = [value[::-1]]
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        whole = encode(raw).decode("ascii")
        forms += [whole, whole.rstrip("=")]
        forms += [_base64_core(encode, raw, offset) for offset in (0, 1, 2)]
    forms += [raw.hex(), raw.hex().upper()]
    for escaped in (
        quote(value, safe=""),
        quote(value),  # "/" kept, as in a path
        quote_plus(value, safe=""),
        quote(value, safe="!~*'()"),  # JavaScript's encodeURIComponent
        quote(value, safe="!~*'();/?:@&=+$,#"),  # JavaScript's encodeURI
    ):
        forms += [escaped, _ESCAPE.sub(lambda m: m.group(0).lower(), escaped)]
    # Inside a quoted string as code prints it: JSON (json.dumps, ASCII-escaped or not)
    # and Python's repr (print(os.environ), print(a dict)), the quotes left out.
    forms += [
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        repr(value)[1:-1],
    ]
    return tuple(
        form for form in dict.fromkeys(forms) if form != value and len(form) >= MIN_FORM_LENGTH
    )


_ESCAPE = re.compile(r"%[0-9A-F]{2}")


def _base64_core(encode: Callable[[bytes], bytes], raw: bytes, offset: int) -> str:
    """The Base64 characters that come from ``raw`` alone when it starts ``offset`` bytes
    (0-2) into a longer encoded text: character ``i`` holds bits ``6i`` to ``6i + 6`` of
    the text, ``raw`` bits ``8 * offset`` to ``8 * (offset + len(raw))``."""
    encoded = encode(b"\0" * offset + raw).decode("ascii")
    return encoded[-(-8 * offset // 6) : 8 * (offset + len(raw)) // 6]


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
    """Finds secret values and their forms (:func:`secret_forms`) in text.
    ``matches(text)`` gives the non-overlapping occurrences, leftmost first and, at one
    position, the longest: what a ``longest|shorter`` alternation would match.

    Every value and form of up to :data:`AUTOMATON_MAX_CHARS` characters is found in one
    pass by an Aho-Corasick automaton with exactly that rule (``ahocorasick_rs``,
    leftmost-longest); one ``str.find`` per value and form took four times as long as
    before the forms. Longer ones (rare: a key file) are looked for with ``str.find``,
    and a text holding one is matched by ``str.find`` for all (exact, as before): an
    automaton over many long values costs hundreds of megabytes (a regex alternation of
    them took minutes to compile). A form is named after its value; a value itself wins
    over another's form that happens to be equal."""

    def __init__(self, items: tuple[tuple[str, str], ...]) -> None:
        self.names: dict[str, str] = {}
        for name, value in items:
            self.names.setdefault(value, name)
        for value, name in list(self.names.items()):
            for form in secret_forms(value):
                self.names.setdefault(form, name)
        self.values = sorted(self.names, key=len, reverse=True)
        self._short = [v for v in self.values if len(v) <= AUTOMATON_MAX_CHARS]
        self._long = [v for v in self.values if len(v) > AUTOMATON_MAX_CHARS]
        self._automaton = (
            AhoCorasick(self._short, matchkind=MatchKind.LeftmostLongest) if self._short else None
        )

    def matches(self, text: str) -> list[tuple[int, int, str]]:
        """``[(start, end, name)]`` of the values in ``text``, in order, not overlapping."""
        if self._long and any(value in text for value in self._long):
            return self._matches_found(text)
        if self._automaton is None:
            return []
        short, names = self._short, self.names
        return [
            (start, end, names[short[index]])
            for index, start, end in self._automaton.find_matches_as_indexes(text)
        ]

    def _matches_found(self, text: str) -> list[tuple[int, int, str]]:
        """:meth:`matches` by one ``str.find`` per value and form."""
        found = []
        for value in self.values:
            start = text.find(value)
            while start != -1:
                found.append((start, start + len(value), value))
                start = text.find(value, start + 1)
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
        self._matcher = _matcher(_key(secret_values))
        # The values and their forms by first character, for _held_length.
        self._by_first: dict[str, list[str]] = {}
        for value in self._matcher.values:
            self._by_first.setdefault(value[0], []).append(value)
        self._longest = len(self._matcher.values[0]) if self._matcher.values else 0
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
        return self._matcher.mask(buffer[:cut])

    def flush(self) -> str:
        """Whatever is still held back, masked; the stream is then empty."""
        rest, self._pending = self._pending, ""
        return self._matcher.mask(rest)

    def _held_length(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that is a proper prefix of a value or
        of one of its forms: tried from the longest suffix that could be one, only where
        its first character starts one."""
        for start in range(max(0, len(buffer) - self._longest + 1), len(buffer)):
            candidates = self._by_first.get(buffer[start])
            if candidates:
                rest = len(buffer) - start
                for value in candidates:
                    if len(value) > rest and value.startswith(buffer[start:]):
                        return rest
        return 0


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
