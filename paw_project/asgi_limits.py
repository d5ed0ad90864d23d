"""ASGI middleware refusing request bodies larger than PAW accepts, while they arrive.

Django's ASGI handler reads a whole request body (into a temporary file that moves to
disk past ``FILE_UPLOAD_MAX_MEMORY_SIZE``) before any view runs, so a view's own check
would come after the bytes were received. This middleware sits in front of it. Each
request gets a limit from the view its path resolves to and from whether it carries
credentials at all:

========================  ==========================================================
``upload``                the upload endpoint (``POST .../files``):
                          ``PAW_MAX_UPLOAD_BYTES`` plus :data:`ENVELOPE_BYTES` for the
                          multipart envelope (the exact per-file limit is enforced while
                          the file streams to disk, ``conversations.uploads``)
``anonymous``             the endpoints used before signing in (token, refresh,
                          registration, the sign-in and registration pages):
                          ``PAW_MAX_ANONYMOUS_BODY_KIB``
``json`` (every other)    ``PAW_MAX_BODY_KIB``
========================  ==========================================================

A request with neither an ``Authorization`` header nor a session cookie gets at most the
``anonymous`` limit wherever it goes (nothing but the sign-in endpoints answers it
anyway), so a client without an account can make the server hold no more than that. An
upload's credentials are checked before its body is read past that limit
(``accounts.authentication.scope_credentials_valid``): a made-up token, a ``Basic``
header or a stale session cookie keep it to the anonymous limit too (found by the
adversarial pass of issue 25: any such header let a stranger send 100 MiB).

Over the limit the answer is ``413 {"detail", "code": "payload_too_large", "limit"}``
with ``Connection: close``: from ``Content-Length`` alone, before the body is read; for a
body sent without one (chunked), as soon as the bytes received pass the limit (the
application is then told the client went away, and the rest is never read). This works
because the server (uvicorn, ``paw_project.web``) hands the body over as it arrives and
reads no further ahead than one chunk.

A view declares its kind with the class attribute ``request_body_kind`` (or the
:func:`request_body` decorator on a function view).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from enum import StrEnum
from typing import Any

from django.conf import settings
from django.http.cookie import parse_cookie
from django.urls import Resolver404, resolve

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Room for the multipart envelope (boundaries, part headers) around the largest file.
ENVELOPE_BYTES = 64 * 1024


class BodyKind(StrEnum):
    """What a view accepts as a request body (see the module docstring for the limits)."""

    UPLOAD = "upload"
    ANONYMOUS = "anonymous"
    JSON = "json"


def request_body(kind: BodyKind) -> Callable:
    """Decorator declaring the body ``kind`` of a function view."""

    def mark(view: Callable) -> Callable:
        view.request_body_kind = kind
        return view

    return mark


def kind_limit(kind: BodyKind) -> int:
    """The body limit of ``kind``, in bytes (from the settings, read on every call)."""
    if kind is BodyKind.UPLOAD:
        return settings.PAW_MAX_UPLOAD_BYTES + ENVELOPE_BYTES
    if kind is BodyKind.ANONYMOUS:
        return settings.PAW_MAX_ANONYMOUS_BODY_KIB * 1024
    return settings.PAW_MAX_BODY_KIB * 1024


def view_kind(path: str) -> BodyKind:
    """The body kind of the view ``path`` resolves to (``json`` when none does)."""
    try:
        match = resolve(path)
    except Resolver404:
        return BodyKind.JSON
    view = getattr(match.func, "view_class", match.func)
    return BodyKind(getattr(view, "request_body_kind", BodyKind.JSON))


def has_credentials(scope: Scope) -> bool:
    """Whether the request carries an ``Authorization`` header or a session cookie
    (checked for presence only: Django authenticates it later)."""
    for name, value in scope.get("headers", ()):
        if name == b"authorization":
            return True
        if name == b"cookie" and settings.SESSION_COOKIE_NAME in parse_cookie(
            value.decode("latin-1")
        ):
            return True
    return False


def body_limit(scope: Scope) -> tuple[BodyKind, int]:
    """``(kind, bytes)``: the kind of body the HTTP request of ``scope`` is held to and
    the largest body it may send."""
    path = scope.get("path", "/")
    root = scope.get("root_path", "")
    if root and path.startswith(root):
        path = path[len(root) :] or "/"
    kind = view_kind(path)
    if not has_credentials(scope) and kind_limit(BodyKind.ANONYMOUS) < kind_limit(kind):
        kind = BodyKind.ANONYMOUS
    return kind, kind_limit(kind)


class BodySizeLimitMiddleware:
    """Wraps an ASGI HTTP application; see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        kind, limit = body_limit(scope)
        if kind is BodyKind.UPLOAD and not await _credentials_valid(scope):
            kind, limit = BodyKind.ANONYMOUS, kind_limit(BodyKind.ANONYMOUS)
        length = _content_length(scope)
        if length is not None and length > limit:
            await _send_413(send, kind)
            return

        received = 0
        cut_off = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, cut_off
            if cut_off:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    cut_off = True
                    # Django treats a disconnect while reading as an aborted request.
                    return {"type": "http.disconnect"}
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, tracking_send)
        if cut_off and not started:
            await _send_413(send, kind)


async def _credentials_valid(scope: Scope) -> bool:
    """Whether the request's credentials authenticate (its database reads on a thread of
    Channels', which closes stale connections around them)."""
    from channels.db import database_sync_to_async

    from accounts.authentication import scope_credentials_valid

    return await database_sync_to_async(scope_credentials_valid)(scope)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_413(send: Send, kind: BodyKind) -> None:
    if kind is BodyKind.UPLOAD:  # the limit a person knows: the file's
        limit = settings.PAW_MAX_UPLOAD_BYTES
        detail = f"The file is larger than the limit of {limit} bytes."
    else:
        limit = kind_limit(kind)
        detail = f"The request body is larger than this endpoint accepts ({limit} bytes)."
    body = json.dumps({"detail": detail, "code": "payload_too_large", "limit": limit}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                # The rest of the body is not read: the connection cannot carry another request.
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
