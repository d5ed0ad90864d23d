"""Send channel-layer messages from synchronous code (services, tasks, sandbox threads).

``asgiref.async_to_sync`` called from a plain thread starts a new event loop for every
call, and channels-redis keeps its connections per loop, so each send would open a new
Redis connection. Here every thread keeps one event loop of its own for its sends.

In embedded mode the in-memory channel layer lives in the web server's event loop and is
not thread-safe: there, ``runpaw`` registers that loop with :func:`set_home_loop` and
sends from other threads are handed to it.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from channels.layers import get_channel_layer

from paw_project import metrics

# Seconds a send may take before the caller gives up on it.
SEND_TIMEOUT = 10.0

_local = threading.local()
_home_loop: asyncio.AbstractEventLoop | None = None


def set_home_loop(loop: asyncio.AbstractEventLoop | None) -> None:
    """Route every send through ``loop`` (the in-memory layer's loop), or stop doing so."""
    global _home_loop
    _home_loop = loop


def _run(coroutine: Coroutine[Any, Any, Any]) -> Any:
    home = _home_loop
    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if home is not None and home.is_running():
        if running is home:
            coroutine.close()
            raise RuntimeError("broadcast.group_send() called from the event loop; await the layer")
        return asyncio.run_coroutine_threadsafe(coroutine, home).result(SEND_TIMEOUT)
    if running is not None:
        # A loop runs in this thread below the caller (Playwright's sync API runs its loop
        # under the code that drives the browser): this thread's own loop cannot run
        # inside it ("Cannot run the event loop while another loop is running", the send
        # lost and its coroutine never awaited), so the send goes from a thread of its own.
        return _aside().submit(_run_on_own_loop, coroutine).result()
    return _run_on_own_loop(coroutine)


def _run_on_own_loop(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run ``coroutine`` on the calling thread's own send loop (made on first use)."""
    loop = getattr(_local, "loop", None)
    if loop is None or loop.is_closed():
        loop = _local.loop = asyncio.new_event_loop()
    return loop.run_until_complete(asyncio.wait_for(coroutine, SEND_TIMEOUT))


_aside_lock = threading.Lock()
_aside_executor: ThreadPoolExecutor | None = None


def _aside() -> ThreadPoolExecutor:
    """The one thread that sends for callers whose thread already has a running loop."""
    global _aside_executor
    with _aside_lock:
        if _aside_executor is None:
            _aside_executor = ThreadPoolExecutor(1, thread_name_prefix="paw-broadcast")
        return _aside_executor


def group_send(group: str, message: dict[str, Any]) -> None:
    """Send ``message`` (a dict with a ``type``) to every channel in ``group``.

    Blocks until the layer accepted it (at most ``SEND_TIMEOUT`` seconds; raises
    ``TimeoutError`` past that). Must not be called from inside an event loop.
    """
    layer = get_channel_layer()
    if layer is None:
        return
    _run(layer.group_send(group, message))
    metrics.channel_send(message["type"])


def conversation_group(conversation_id: Any) -> str:
    """The channel-layer group of a conversation: ``conversation.<id>``."""
    return f"conversation.{conversation_id}"


def session_group(session_key: str) -> str:
    """The channel-layer group of the websockets one browser session opened:
    ``session.<key>``."""
    return f"session.{session_key}"


def user_group(user_id: Any) -> str:
    """The channel-layer group of a user's conversation-list sockets (``ws/user/``), which
    get every change of the user's conversations: ``user.<id>``."""
    return f"user.{user_id}"


def revocation_group(user_id: Any) -> str:
    """The channel-layer group of every websocket a user has open, told when the user's
    credentials are revoked: ``revoked.<id>``. Kept apart from :func:`user_group` so a
    conversation's socket is not sent every change of every other conversation of its
    user (a hundred sockets of one user made each run's status change a hundred
    messages, and the channel layer fell seconds behind)."""
    return f"revoked.{user_id}"
