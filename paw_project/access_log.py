"""Access lines for every HTTP response and websocket connection, through Python logging.

The web server's own access log is off (``paw_project.web``); this ASGI middleware writes
one ``paw.access`` INFO line per response instead, in both modes, so ``PAW_LOG_JSON=1``
makes them JSON like every other line. Each line
carries the request id of the response it describes and, as fields, ``client``,
``method``, ``path`` (never the query string: it may hold a token), ``status``, ``size``
(bytes) and ``duration_ms``.
"""

from __future__ import annotations

import logging
import time
from typing import Any

logger = logging.getLogger("paw.access")

Scope = dict[str, Any]
Message = dict[str, Any]


def _client(scope: Scope) -> str:
    client = scope.get("client")
    return f"{client[0]}:{client[1]}" if client else "-"


class AccessLogMiddleware:
    """ASGI middleware around the whole application (``paw_project.asgi``)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _http(self, scope: Scope, receive: Any, send: Any) -> None:
        started = time.monotonic()
        state: dict[str, Any] = {"status": None, "size": 0, "request_id": None, "done": False}

        def log() -> None:
            if state["done"]:
                return
            state["done"] = True
            status = state["status"] or "-"
            duration_ms = round((time.monotonic() - started) * 1000, 1)
            method, path = scope.get("method", "-"), scope.get("path", "-")
            logger.info(
                '%s "%s %s HTTP/%s" %s %s %.1fms',
                _client(scope), method, path, scope.get("http_version", "1.1"), status,
                state["size"], duration_ms,
                extra={
                    "client": _client(scope), "method": method, "path": path,
                    "status": state["status"], "size": state["size"],
                    "duration_ms": duration_ms, "request_id": state["request_id"],
                },
            )  # fmt: skip

        async def send_and_note(message: Message) -> None:
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
                for name, value in message.get("headers", ()):
                    if name.lower() == b"x-request-id":
                        state["request_id"] = value.decode("latin-1")
            await send(message)
            if message["type"] == "http.response.body":
                state["size"] += len(message.get("body", b""))
                if not message.get("more_body", False):
                    log()

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            log()  # the client went away, or the application failed before answering

    async def _websocket(self, scope: Scope, receive: Any, send: Any) -> None:
        started = time.monotonic()
        state = {"accepted": False, "done": False}
        path = scope.get("path", "-")

        def log(event: str) -> None:
            duration_ms = round((time.monotonic() - started) * 1000, 1)
            logger.info(
                "%s %s %s %.1fms",
                _client(scope), event, path, duration_ms,
                extra={"client": _client(scope), "event": event, "path": path,
                       "duration_ms": duration_ms},
            )  # fmt: skip

        def closed(event: str) -> None:
            if not state["done"]:
                state["done"] = True
                log(event if state["accepted"] else "WSREJECT")

        async def send_and_note(message: Message) -> None:
            await send(message)
            if message["type"] == "websocket.accept":
                state["accepted"] = True
                log("WSCONNECT")
            elif message["type"] == "websocket.close":
                closed("WSDISCONNECT")

        async def receive_and_note() -> Message:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                closed("WSDISCONNECT")
            return message

        try:
            await self.app(scope, receive_and_note, send_and_note)
        finally:
            closed("WSDISCONNECT")
