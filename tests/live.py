"""Test helpers for live behaviour: listening to a conversation's channel-layer group,
waiting for database state written by another process, and websocket tabs on PAW's
application that are always disconnected."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.db import close_old_connections

from paw_project import live_log
from paw_project.broadcast import conversation_group

T = TypeVar("T")

_open_tabs: list[WebsocketCommunicator] = []


def websocket_tab(
    path: str, headers: list[tuple[bytes, bytes]], **kwargs: Any
) -> WebsocketCommunicator:
    """A communicator on PAW's ASGI application at ``path`` (not connected yet), kept to be
    disconnected by :func:`tabs_disconnect` at the end of the test (a module's autouse
    fixture), whatever happens to it."""
    from paw_project.asgi import application

    communicator = WebsocketCommunicator(application, path, headers, **kwargs)
    _open_tabs.append(communicator)
    return communicator


async def tabs_disconnect() -> None:
    """Disconnect every tab :func:`websocket_tab` made since the last call, closed by the
    server or not: a consumer still running (or still releasing its subscription after
    the server closed it) was destroyed pending with the test's event loop, and its
    coroutines surfaced as "never awaited" warnings in a later test. Disconnecting a tab
    again does nothing; a slow release gets 10 s, not Channels' default 1 s. A tab whose
    application has already ended is left: it holds nothing, and if it ended with an
    error, the test that opened it saw it (a module without this fixture leaves its tabs
    to the next call, in another test: that one must not fail on them)."""
    tabs = _open_tabs[:]
    _open_tabs.clear()
    for tab in tabs:
        if tab.future.done():
            continue
        await tab.disconnect(timeout=10)


def wait_for(
    check: Callable[[], T], *, timeout: float = 20.0, interval: float = 0.05, what: str = ""
) -> T:
    """Call ``check`` until it returns something truthy; fail after ``timeout`` seconds.
    Between calls, connections another process's writes may have outdated are closed
    (in a test without database access there are none to close)."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(RuntimeError):  # pytest-django: "Database access not allowed"
            close_old_connections()
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what or check}")
        time.sleep(interval)


class GroupListener:
    """Collects every message sent to a conversation's group, from a background thread,
    and (Redis mode) every append to its live log, as the group's embedded-mode message
    ``{"type": "conversation.events", "events": [...], "sent_at"}``."""

    def __init__(self, conversation_id: Any) -> None:
        self.conversation_id = conversation_id
        self.group = conversation_group(conversation_id)
        self.messages: list[dict[str, Any]] = []
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> GroupListener:
        self._thread.start()
        assert self._ready.wait(10), "listener did not join the group"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        asyncio.run(self._listen())

    async def _listen(self) -> None:
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(self.group, channel)
        hub = live_log.hub() if live_log.enabled() else None
        if hub is not None:
            await hub.follow(self.conversation_id, self)
        self._ready.set()
        # One receive at a time, never cancelled while the listener runs: cancelling a
        # channels-redis receive that is fetching a message loses that message.
        pending: asyncio.Future | None = None
        try:
            while not self._stop.is_set():
                if pending is None:
                    pending = asyncio.ensure_future(layer.receive(channel))
                done, _ = await asyncio.wait({pending}, timeout=0.2)
                if pending in done:
                    self.messages.append(pending.result())
                    pending = None
        finally:
            if pending is not None:
                pending.cancel()
            await layer.group_discard(self.group, channel)
            if hub is not None:
                await hub.leave(self.conversation_id, self)

    def live_batch(self, first: int, sent_ms: int, texts: list[str]) -> None:
        """An append to the live log (``paw_project.live_log.Subscriber``)."""
        self.messages.append(
            {
                "type": "conversation.events",
                "events": [json.loads(text) for text in texts],
                "sent_at": sent_ms / 1000,
            }
        )

    def live_resync(self) -> None:
        raise AssertionError("the listener's live-log subscription broke")

    def events(self) -> list[dict[str, Any]]:
        """Every stored event received, in order: ``{"cursor", "run_id", "event"}``."""
        return [e for m in self.messages if m["type"] == "conversation.events" for e in m["events"]]

    def of_type(self, message_type: str) -> list[dict[str, Any]]:
        """The plain messages (``run.status``, ``agent_confirm_request`` …) of a type."""
        return [
            m["message"] for m in self.messages
            if m["type"] == "conversation.message" and m["message"]["type"] == message_type
        ]  # fmt: skip

    def wait(self, check: Callable[[GroupListener], T], timeout: float = 20.0, what: str = "") -> T:
        deadline = time.monotonic() + timeout
        while True:
            value = check(self)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}; got {self.messages[-5:]}")
            time.sleep(0.02)
