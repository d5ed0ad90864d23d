"""The suite-wide scan for secret values in what PAW sends out (issue 8: "a scan of every
API response and admin page in the suite for known secret values").

:func:`install` (done once per session by ``tests/conftest.py``) makes the test process
keep, for the test under way, what PAW answers through the test tools:

* every response of Django's test clients: ``django.test.Client`` (DRF's ``APIClient``
  and the admin pages go through it) and ``AsyncClient``: status, headers, cookies and
  body. A streamed body is read whole and put back as the same chunks, so the test can
  still read it afterwards;
* every message a ``channels.testing.WebsocketCommunicator`` receives from the app
  (``receive_from`` and ``receive_json_from`` read through ``receive_output``);
* every message the test process receives from the channel layer (the statuses PAW
  fans out to websocket clients, and in the embedded mode the events) and from a
  conversation's live log (the events, in Redis mode), as ``tests.live.GroupListener``
  and the websocket consumers under test see them.

It also learns every *known secret value* (:func:`known_secret_values`): each plaintext
that passes through the vault's encrypted field (``Secret.value`` written by any service,
the admin, ``update()`` or read back), each value registered for masking
(``secrets_vault.masking.secret_values_known``), the values tests :func:`remember` (their
generated secrets, the scripted model's API key), and Django's ``SECRET_KEY`` (with its
fallbacks) and ``PAW_LLM_API_KEY``. :meth:`SecretScan.check` fails when anything kept
contains one of them, as is, JSON-escaped, HTML-escaped or URL-encoded, or in one of the
forms masking covers (issue 25): reversed, Base64 (standard and URL-safe, with and without
padding) or hexadecimal (lower and upper case), computed here on their own. Values shorter
than ``MIN_MASKED_LENGTH`` are not looked for (masking leaves them too), nor forms shorter
than ``MIN_FORM_LENGTH`` or of values longer than ``MAX_FORM_SOURCE_LENGTH``.

Two helpers reach further, for the tests that produce runtime output
(``tests/sandboxes/test_no_secret_on_any_page.py``): :func:`record_stored_runtime_output`
records every text column of the rows that hold what runtimes wrote (events, runs,
approvals, sandboxes' stderr tails, usage), and :func:`visit_every_admin_page` opens every
admin change list and change page.

Not covered: what a separate process serves (the web process of the browser tests, the
worker's own output, which the tests that need it read from its log).
"""

from __future__ import annotations

import base64
import functools
import html
import json
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest

from secrets_vault.masking import (
    MAX_FORM_SOURCE_LENGTH,
    MIN_FORM_LENGTH,
    MIN_MASKED_LENGTH,
    secret_values_known,
)

_known_lock = threading.Lock()
_known: set[str] = set()


def remember(*values: str) -> None:
    """Add ``values`` to the known secret values for the rest of the session."""
    with _known_lock:
        _known.update(v for v in values if isinstance(v, str) and len(v) >= MIN_MASKED_LENGTH)


def forget(*values: str) -> None:
    """Stop looking for ``values`` (a test that made a plain word a secret on purpose —
    a host, a database name — forgets it, or every later response naming that host would
    be a "leak"): from the values remembered here and those registered for masking."""
    from secrets_vault import masking

    with _known_lock:
        _known.difference_update(values)
    with masking._known_lock:  # the registry has no public way to forget: tests only
        for value in values:
            masking._known.pop(value, None)
            masking._known_for_logs.pop(value, None)


def known_secret_values() -> set[str]:
    """Every secret value the scan looks for now (see the module docstring)."""
    from django.conf import settings

    sentinels = [
        settings.SECRET_KEY,
        *getattr(settings, "SECRET_KEY_FALLBACKS", []),
        getattr(settings, "PAW_LLM_API_KEY", ""),
    ]
    with _known_lock:
        values = set(_known)
    values.update(secret_values_known().values())
    values.update(v for v in sentinels if isinstance(v, str))
    return {v for v in values if len(v) >= MIN_MASKED_LENGTH}


def _forms(value: str) -> set[str]:
    """The ways ``value`` can be written in a body: as is, in a JSON string (ASCII-escaped
    or not), HTML-escaped (templates) and URL-encoded (links, redirects); and reversed,
    Base64- or hex-encoded, the forms a runtime prints it in that masking covers."""
    forms = {
        value,
        json.dumps(value)[1:-1],
        json.dumps(value, ensure_ascii=False)[1:-1],
        html.escape(value),
        quote(value, safe=""),
    }
    if len(value) <= MAX_FORM_SOURCE_LENGTH:
        raw = value.encode("utf-8")
        encoded = [value[::-1], raw.hex(), raw.hex().upper()]
        for encode in (base64.b64encode, base64.urlsafe_b64encode):
            whole = encode(raw).decode("ascii")
            encoded += [whole, whole.rstrip("=")]
        forms.update(form for form in encoded if len(form) >= MIN_FORM_LENGTH)
    return forms


@functools.lru_cache(maxsize=8)
def _pattern(values: frozenset[str]) -> tuple[re.Pattern[bytes] | None, dict[bytes, str]]:
    """One regex for every form of every value (longest first), and form → value."""
    by_form: dict[bytes, str] = {}
    for value in values:
        for form in _forms(value):
            by_form.setdefault(form.encode("utf-8"), value)
    if not by_form:
        return None, by_form
    ordered = sorted(by_form, key=len, reverse=True)
    return re.compile(b"|".join(re.escape(form) for form in ordered)), by_form


@dataclass(frozen=True)
class Leak:
    """A known secret ``value`` found in what PAW sent (``where``: which response or
    message)."""

    where: str
    value: str


class SecretScan:
    """What the test process received from PAW since the last check. Thread-safe: the
    channel layer is read from listener threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._records: list[tuple[str, bytes]] = []

    def record(self, where: str, data: bytes | str) -> None:
        """Keep ``data`` (received from PAW at ``where``) for the next check."""
        raw = data.encode("utf-8", errors="replace") if isinstance(data, str) else bytes(data)
        with self._lock:
            self._records.append((where, raw))

    def recorded(self) -> list[str]:
        """Where each record still waiting for a check came from, oldest first."""
        with self._lock:
            return [where for where, _ in self._records]

    def take(self) -> list[Leak]:
        """The leaks in everything recorded so far; the records are then forgotten."""
        with self._lock:
            records, self._records = self._records, []
        if not records:
            return []
        pattern, by_form = _pattern(frozenset(known_secret_values()))
        if pattern is None:
            return []
        leaks: list[Leak] = []
        for where, raw in records:
            found = dict.fromkeys(by_form[match.group(0)] for match in pattern.finditer(raw))
            leaks += [Leak(where, value) for value in found]
        return leaks

    def check(self) -> None:
        """Fail (``AssertionError``) naming every leak in what was recorded so far."""
        __tracebackhide__ = True
        leaks = self.take()
        if leaks:
            listed = "\n".join(f"  {leak.where}: {leak.value!r}" for leak in leaks)
            raise AssertionError(f"known secret value(s) in what PAW sent:\n{listed}")


#: The scan of the test under way (one per process; checked after each test).
SCAN = SecretScan()


# --- what is recorded ---------------------------------------------------------------------


def _flatten(obj: Any) -> bytes:
    """Every string, byte string, key and scalar of a message, one per line, unescaped
    (a JSON text inside stays as sent, where the JSON-escaped form is looked for)."""
    parts: list[bytes] = []

    def walk(value: Any) -> None:
        if isinstance(value, bytes | bytearray):
            parts.append(bytes(value))
        elif isinstance(value, str):
            parts.append(value.encode("utf-8", errors="replace"))
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(key)
                walk(item)
        elif isinstance(value, list | tuple | set):
            for item in value:
                walk(item)
        elif value is not None:
            parts.append(str(value).encode())

    walk(obj)
    return b"\n".join(parts)


def _head(response: Any) -> bytes:
    headers = "\n".join(f"{name}: {value}" for name, value in response.headers.items())
    return f"{response.status_code}\n{headers}\n{response.cookies.output()}\n".encode()


def _where(request: dict[str, Any], response: Any) -> str:
    method = request.get("REQUEST_METHOD") or request.get("method") or "?"
    path = request.get("PATH_INFO") or request.get("path") or "?"
    return f"{method} {path} ({response.status_code})"


async def _chunks_again(chunks: list[bytes]):
    for chunk in chunks:
        yield chunk


def _buffer_stream(response: Any) -> bytes:
    """Read a streamed body whole (sync client) and put the same chunks back."""
    if getattr(response, "is_async", False):
        from asgiref.sync import async_to_sync

        async def read() -> list[bytes]:
            return [chunk async for chunk in response.streaming_content]

        chunks = async_to_sync(read)()
        response.streaming_content = _chunks_again(chunks)
    else:
        chunks = list(response.streaming_content)
        response.streaming_content = chunks
    return b"".join(chunks)


async def _abuffer_stream(response: Any) -> bytes:
    """Read a streamed body whole (async client) and put the same chunks back."""
    if getattr(response, "is_async", False):
        chunks = [chunk async for chunk in response.streaming_content]
        response.streaming_content = _chunks_again(chunks)
    else:
        chunks = list(response.streaming_content)
        response.streaming_content = chunks
    return b"".join(chunks)


def _wrap_client_request(original: Callable) -> Callable:
    @functools.wraps(original)
    def request(self: Any, **request: Any) -> Any:
        response = original(self, **request)
        body = _buffer_stream(response) if response.streaming else response.content
        SCAN.record(_where(request, response), _head(response) + body)
        return response

    return request


def _wrap_async_client_request(original: Callable) -> Callable:
    @functools.wraps(original)
    async def request(self: Any, **request: Any) -> Any:
        response = await original(self, **request)
        body = await _abuffer_stream(response) if response.streaming else response.content
        SCAN.record(_where(request, response), _head(response) + body)
        return response

    return request


def _wrap_receive_output(original: Callable) -> Callable:
    @functools.wraps(original)
    async def receive_output(self: Any, *args: Any, **kwargs: Any) -> Any:
        message = await original(self, *args, **kwargs)
        SCAN.record(f"websocket {self.scope.get('path', '?')}", _flatten(message))
        return message

    return receive_output


def _wrap_layer_receive(original: Callable) -> Callable:
    @functools.wraps(original)
    async def receive(self: Any, channel: str, *args: Any, **kwargs: Any) -> Any:
        message = await original(self, channel, *args, **kwargs)
        SCAN.record(f"channel layer message ({message.get('type', '?')})", _flatten(message))
        return message

    return receive


def _wrap_live_message(original: Callable) -> Callable:
    @functools.wraps(original)
    def parse_message(data: bytes) -> Any:
        SCAN.record("live log message", data)
        return original(data)

    return parse_message


# --- what is known ------------------------------------------------------------------------


def _wrap_get_prep_value(original: Callable) -> Callable:
    @functools.wraps(original)
    def get_prep_value(self: Any, value: Any) -> Any:
        if isinstance(value, str):
            remember(value)
        return original(self, value)

    return get_prep_value


def _wrap_from_db_value(original: Callable) -> Callable:
    @functools.wraps(original)
    def from_db_value(self: Any, *args: Any, **kwargs: Any) -> Any:
        value = original(self, *args, **kwargs)
        if isinstance(value, str):
            remember(value)
        return value

    return from_db_value


def install() -> Callable[[], None]:
    """Start recording and learning (see the module docstring); returns the undo."""
    from channels.testing import WebsocketCommunicator
    from django.conf import settings
    from django.test import AsyncClient, Client
    from django.utils.module_loading import import_string

    from paw_project import live_log
    from secrets_vault.fields import EncryptedSecretField

    patch = pytest.MonkeyPatch()
    wrappers: list[tuple[Any, str, Callable[[Callable], Callable]]] = [
        (Client, "request", _wrap_client_request),
        (AsyncClient, "request", _wrap_async_client_request),
        (WebsocketCommunicator, "receive_output", _wrap_receive_output),
        (EncryptedSecretField, "get_prep_value", _wrap_get_prep_value),
        (EncryptedSecretField, "from_db_value", _wrap_from_db_value),
        (live_log, "parse_message", _wrap_live_message),
    ]
    layers = getattr(settings, "CHANNEL_LAYERS", {})
    if "default" in layers:
        layer_class = import_string(layers["default"]["BACKEND"])
        wrappers.append((layer_class, "receive", _wrap_layer_receive))
    for owner, name, wrap in wrappers:
        patch.setattr(owner, name, wrap(getattr(owner, name)))
    return patch.undo


# --- what PAW stored and shows operators ----------------------------------------------------

#: The apps whose rows hold what runtimes wrote (events, answers, errors, approvals' texts,
#: stderr tails, command lines, usage) or what is derived from it.
RUNTIME_OUTPUT_APPS = ("conversations", "sandboxes", "billing", "audit")


def record_stored_runtime_output() -> int:
    """Record, for the scan, every text column (``CharField``, ``TextField``,
    ``JSONField``) of every row of the models of :data:`RUNTIME_OUTPUT_APPS`, as stored
    in the database: what a runtime wrote must be masked *before* it is stored, not only
    where it is shown. Returns how many values were recorded (needs database access)."""
    from django.apps import apps
    from django.db import models

    recorded = 0
    for label in RUNTIME_OUTPUT_APPS:
        for model in apps.get_app_config(label).get_models():
            columns = [
                field.attname
                for field in model._meta.concrete_fields
                if isinstance(field, models.CharField | models.TextField | models.JSONField)
            ]
            if not columns:
                continue
            for row in model.objects.values_list("pk", *columns):
                pk, *values = row
                for column, value in zip(columns, values, strict=True):
                    if value in (None, "", [], {}):
                        continue
                    text = value if isinstance(value, str) else json.dumps(value)
                    SCAN.record(f"database {model._meta.db_table}.{column} (pk {pk})", text)
                    recorded += 1
    return recorded


def visit_every_admin_page(client: Any, operator: Any) -> list[str]:
    """GET, with ``client`` (signed in as the superuser ``operator``), the change list of
    every model registered in the admin and the change page of each of its rows (at most
    200 per model; what the test client receives is recorded by the scan). Returns the
    paths visited; fails on a page that does not answer 200."""
    from django.contrib import admin
    from django.test import RequestFactory
    from django.urls import reverse

    request = RequestFactory().get("/admin/")
    request.user = operator
    visited = []
    for model, model_admin in admin.site._registry.items():
        info = (model._meta.app_label, model._meta.model_name)
        paths = [reverse("admin:{}_{}_changelist".format(*info))]
        queryset = model_admin.get_queryset(request)
        for pk in queryset.values_list("pk", flat=True)[:200]:
            paths.append(reverse("admin:{}_{}_change".format(*info), args=[pk]))
        for path in paths:
            response = client.get(path)
            assert response.status_code == 200, (path, response.status_code)
            visited.append(path)
    return visited
