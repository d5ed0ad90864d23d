"""ASGI middleware refusing request bodies larger than PAW accepts, before Django reads them.

Django's ASGI handler reads a whole request body into a temporary file before any view
runs, so the upload view's own check would come after the bytes were spooled. This
middleware answers ``413 {"detail", "code": "payload_too_large"}`` from ``Content-Length``
alone, without reading the body, and cuts off a body sent without one (chunked) as soon
as it passes the limit. The limit is ``PAW_MAX_UPLOAD_BYTES`` plus room for the multipart
envelope; the exact per-file limit is enforced while the upload streams
(``conversations.uploads``).

Daphne itself receives a request's body before it calls the application, so a proxy in
front (e.g. nginx ``client_max_body_size``) is what keeps such bytes off the server
entirely; see the README.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Room for the multipart envelope (boundaries, part headers) around the largest file.
ENVELOPE_BYTES = 64 * 1024


def body_limit() -> int:
    """The largest request body accepted, in bytes."""
    return settings.PAW_MAX_UPLOAD_BYTES + ENVELOPE_BYTES


class BodySizeLimitMiddleware:
    """Wraps an ASGI HTTP application; see the module docstring."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit()
        length = _content_length(scope)
        if length is not None and length > limit:
            await _send_413(send)
            return

        received = 0
        cut_off = False
        started = False

        async def limited_receive() -> Message:
            nonlocal received, cut_off
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
            await _send_413(send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_413(send: Send) -> None:
    limit = settings.PAW_MAX_UPLOAD_BYTES
    body = json.dumps(
        {
            "detail": f"The request body is larger than the limit of {limit} bytes.",
            "code": "payload_too_large",
            "limit": limit,
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
