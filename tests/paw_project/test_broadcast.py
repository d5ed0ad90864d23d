"""Channel-layer sends from synchronous code (``paw_project.broadcast``) reach the group's
listeners, from any thread."""

from __future__ import annotations

import asyncio
import uuid
import warnings

from paw_project import broadcast
from tests.live import GroupListener


def _ping(conversation_id: uuid.UUID, text: str) -> None:
    broadcast.group_send(
        broadcast.conversation_group(conversation_id),
        {"type": "conversation.message", "message": {"type": "ping", "text": text}},
    )


def test_a_send_from_a_plain_thread_is_delivered():
    conversation_id = uuid.uuid4()
    with GroupListener(conversation_id) as listener:
        _ping(conversation_id, "plain")
        assert listener.wait(lambda heard: heard.of_type("ping"), what="the ping") == [
            {"type": "ping", "text": "plain"}
        ]


def test_a_send_from_a_thread_whose_loop_runs_below_the_caller_is_delivered():
    """As under Playwright's sync API (the browser tests), a loop runs in the calling
    thread while synchronous code sends: the send still goes out, and no coroutine is left
    never awaited."""
    conversation_id = uuid.uuid4()

    async def under_a_running_loop() -> None:
        _ping(conversation_id, "below a loop")

    with GroupListener(conversation_id) as listener, warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        asyncio.run(under_a_running_loop())
        assert listener.wait(lambda heard: heard.of_type("ping"), what="the ping") == [
            {"type": "ping", "text": "below a loop"}
        ]
