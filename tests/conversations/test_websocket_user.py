"""The person's own websocket (``ws/user/``): the conversation list's live feed — runs
starting and ending, approvals raised and decided, titles, deletions — for every
conversation of theirs, never anyone else's (real worker, runtime processes, Redis)."""

from __future__ import annotations

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from conversations.services.approvals import approval_decide
from conversations.services.conversations import conversation_delete, conversation_update
from tests.conversations.test_websocket import (
    conversation_with_mode,
    pending_approval,
    receive_until,
    session_cookie,
    start,
)
from tests.factories import ConversationFactory
from tests.live import tabs_disconnect, websocket_tab

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
async def _tabs_disconnected():
    """Every tab a test opened is disconnected at its end (:func:`tests.live.tabs_disconnect`)."""
    yield
    await tabs_disconnect()


async def user_socket(user=None, *, cookie: bool = True, sessionid: str | None = None):
    headers = [(b"origin", b"http://localhost")]
    if cookie:
        sid = sessionid or await session_cookie(user)
        headers.append((b"cookie", f"sessionid={sid}".encode()))
    communicator = websocket_tab("/ws/user/", headers)
    connected, _ = await communicator.connect()
    assert connected
    await communicator.send_json_to({"type": "ping"})
    assert await communicator.receive_json_from(timeout=5) == {"type": "pong"}  # joined
    return communicator


def updated(conversation, predicate=lambda state: True):
    def match(message):
        return (
            message["type"] == "conversation.updated"
            and message["conversation"]["id"] == str(conversation.id)
            and predicate(message["conversation"])
        )

    return match


async def owner(conversation):
    return await database_sync_to_async(lambda: conversation.user)()


async def test_an_approval_in_another_conversation_reaches_the_persons_socket(fake_worker):
    waiting = await conversation_with_mode("confirm")
    user = await owner(waiting)
    socket = await user_socket(user)
    await start(waiting)
    await receive_until(socket, updated(waiting, lambda s: s["active"]), timeout=10)
    asked = await receive_until(socket, updated(waiting, lambda s: s["pending_approvals"]))
    state = asked[-1]["conversation"]
    approval = await pending_approval(waiting)
    assert state["active"] is True
    assert state["pending_approvals"] == [
        {
            "id": str(approval.id),
            "kind": "confirm",
            "expires_at": approval.expires_at.isoformat().replace("+00:00", "Z"),
        }
    ]
    assert isinstance(state["as_of"], float) and state["last_activity"].endswith("Z")

    await database_sync_to_async(approval_decide)(approval_id=approval.id, user=user, approved=True)
    await receive_until(socket, updated(waiting, lambda s: not s["pending_approvals"]))
    ended = await receive_until(socket, updated(waiting, lambda s: not s["active"]), timeout=20)
    assert ended[-1]["conversation"]["active_run_id"] is None
    await socket.disconnect()


async def test_titles_creations_and_deletions_are_sent_and_only_to_their_owner(db):
    conversation = await database_sync_to_async(ConversationFactory)(title="before")
    user = await owner(conversation)
    stranger = await database_sync_to_async(ConversationFactory)()
    mine = await user_socket(user)
    theirs = await user_socket(await owner(stranger))

    await database_sync_to_async(conversation_update)(
        user=user, conversation_id=conversation.id, title="after"
    )
    renamed = await receive_until(mine, updated(conversation), timeout=5)
    assert renamed[-1]["conversation"]["title"] == "after"
    assert renamed[-1]["conversation"]["active"] is False

    client = Client()
    await database_sync_to_async(client.force_login)(user)
    response = await database_sync_to_async(client.post)(
        "/api/conversations", {"title": "fresh"}, content_type="application/json"
    )
    created = response.json()
    message = await mine.receive_json_from(timeout=5)
    assert message["type"] == "conversation.updated"
    assert message["conversation"]["id"] == created["id"]
    assert message["conversation"]["title"] == "fresh"

    await database_sync_to_async(conversation_delete)(user=user, conversation_id=conversation.id)
    assert await mine.receive_json_from(timeout=5) == {
        "type": "conversation.removed",
        "id": str(conversation.id),
    }
    # Nothing of it reached the other person's socket.
    assert await theirs.receive_nothing(timeout=0.5)
    await theirs.send_json_to({"type": "ping"})
    assert await theirs.receive_json_from(timeout=5) == {"type": "pong"}
    await mine.disconnect()
    await theirs.disconnect()


async def test_a_conversation_socket_ignores_the_per_user_messages(db):
    """The conversation socket follows ``user.<id>`` too (revocations): the sidebar's
    messages must neither reach its client nor break it."""
    from tests.conversations.test_websocket import connect

    conversation = await database_sync_to_async(ConversationFactory)(title="one")
    user = await owner(conversation)
    tab = await connect(conversation)
    await tab.send_json_to({"type": "resume", "after": 0})
    await database_sync_to_async(conversation_update)(
        user=user, conversation_id=conversation.id, title="two"
    )
    assert await tab.receive_nothing(timeout=1)
    await tab.send_json_to({"type": "ping"})
    assert await tab.receive_json_from(timeout=5) == {"type": "pong"}
    await tab.disconnect()


async def test_the_user_socket_refuses_strangers_and_closes_on_sign_out(db):
    communicator = websocket_tab("/ws/user/", [(b"origin", b"http://localhost")])
    connected, _ = await communicator.connect()
    assert connected
    assert await communicator.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}

    conversation = await database_sync_to_async(ConversationFactory)()
    client = Client()
    await database_sync_to_async(client.force_login)(await owner(conversation))
    socket = await user_socket(sessionid=client.cookies["sessionid"].value)
    await socket.send_json_to({"type": "resume", "after": 0})
    assert (await socket.receive_json_from(timeout=5))["code"] == "unknown_type"
    await socket.send_to(text_data="not json")
    assert (await socket.receive_json_from(timeout=5))["code"] == "bad_json"
    response = await database_sync_to_async(client.post)("/accounts/logout/")
    assert response.status_code == 302
    assert await socket.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
