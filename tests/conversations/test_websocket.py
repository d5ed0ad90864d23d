"""The conversation websocket: live events exactly once across reconnects, approvals,
cancel, auth and bad input (real worker, real runtime processes, real Redis)."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from django.test import Client

from accounts.services import auth_token_pair_for, auth_tokens_revoke
from conversations.models import Approval, Conversation, Run, RunEvent
from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from tests.factories import ConversationFactory, UserFactory
from tests.live import tabs_disconnect, wait_for, websocket_tab
from tests.sandboxes.scenarios import FAKE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(autouse=True)
async def _tabs_disconnected():
    """Every tab a test opened is disconnected at its end (:func:`tests.live.tabs_disconnect`)."""
    yield
    await tabs_disconnect()


@database_sync_to_async
def conversation_with_mode(mode: str, **fields) -> Conversation:
    conversation = ConversationFactory(**fields)
    (workspace_ensure(conversation.id) / "fake_mode").write_text(mode)
    return conversation


@database_sync_to_async
def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def connect(
    conversation: Conversation,
    *,
    user=None,
    path: str | None = None,
    cookie=True,
    sessionid: str | None = None,
):
    """A tab on ``conversation``: signed in with a new session of ``user`` (default: the
    owner), or the given ``sessionid``, or without a cookie (``cookie=False``)."""
    headers = [(b"origin", b"http://localhost")]
    if cookie:
        sid = sessionid or await session_cookie(
            user or await database_sync_to_async(lambda: conversation.user)()
        )
        headers.append((b"cookie", f"sessionid={sid}".encode()))
    communicator = websocket_tab(path or f"/ws/conversations/{conversation.id}/", headers)
    connected, _ = await communicator.connect()
    assert connected
    return communicator


async def start(conversation: Conversation, prompt: str = "go") -> Run:
    return await database_sync_to_async(run_start)(
        user=conversation.user, conversation_id=conversation.id, prompt=prompt
    )


async def receive_until(
    communicator, predicate, *, timeout: float = 20, limit: int = 100_000
) -> list[dict]:
    """Messages received until one satisfies ``predicate`` (included)."""
    messages = []
    for _ in range(limit):
        message = await communicator.receive_json_from(timeout=timeout)
        messages.append(message)
        if predicate(message):
            return messages
    raise AssertionError("predicate never matched")


def is_result(message) -> bool:
    return message["type"] == "run.event" and message["event"]["type"] == "result"


def deltas(messages) -> str:
    return "".join(
        m["event"]["text"]
        for m in messages
        if m["type"] == "run.event" and m["event"]["type"] == "delta"
    )


async def test_a_reconnecting_client_gets_every_number_exactly_once_in_order(fake_worker):
    conversation = await conversation_with_mode("flood 400 0.005")
    first = await connect(conversation)
    await first.send_json_to({"type": "resume", "after": 0})
    await start(conversation)
    seen = await receive_until(
        first, lambda m: m["type"] == "run.event" and "100" in m["event"].get("text", "").split()
    )
    await first.disconnect()
    last_cursor = max(m["cursor"] for m in seen if m["type"] == "run.event")
    second = await connect(conversation)
    await second.send_json_to({"type": "resume", "after": last_cursor})
    rest = await receive_until(second, is_result)
    await second.disconnect()
    numbers = [int(n) for n in (deltas(seen) + deltas(rest)).split()]
    missing = sorted(set(range(1, 401)) - set(numbers))
    repeated = sorted({n for n in numbers if numbers.count(n) > 1})
    stored = await database_sync_to_async(
        lambda: [
            e.payload.get("text")
            for e in RunEvent.objects.filter(conversation=conversation, type="delta").order_by(
                "cursor"
            )
        ]
    )()
    assert (missing, repeated) == ([], []), (
        f"resumed after cursor {last_cursor}; stored {len(stored)} deltas; first tab "
        f"{[(m['cursor'], m['event'].get('text')) for m in seen if m['type'] == 'run.event'][-3:]}; second tab "
        f"{[(m['cursor'], m['event'].get('text')) for m in rest if m['type'] == 'run.event'][:12]}"
    )
    assert numbers == list(range(1, 401))
    cursors = [m["cursor"] for m in seen + rest if m["type"] == "run.event"]
    assert cursors == sorted(set(cursors))


async def test_two_clients_receive_identical_event_sequences(fake_worker):
    conversation = await conversation_with_mode("flood 300 0.001")
    tabs = [await connect(conversation), await connect(conversation)]
    for tab in tabs:
        await tab.send_json_to({"type": "resume", "after": 0})
    await start(conversation)
    received = [await receive_until(tab, is_result) for tab in tabs]
    for tab in tabs:
        await tab.disconnect()
    events = [[(m["cursor"], m["event"]) for m in r if m["type"] == "run.event"] for r in received]
    assert events[0] == events[1]
    assert deltas(received[0]) == "".join(f"{n} " for n in range(1, 301))


def carries_result(message) -> bool:
    return message["type"] == "run.events" and any(
        e["event"]["type"] == "result" for e in message["events"]
    )


async def test_batch_frames_carry_every_event_once_in_order_live_and_replayed(fake_worker):
    """``?frames=batch``: events come as ``run.events`` frames, live (a stored batch each)
    and replayed (a page each), and together they are the stored events, one for one."""
    conversation = await conversation_with_mode("flood 300 0.001")
    path = f"/ws/conversations/{conversation.id}/?frames=batch"
    live = await connect(conversation, path=path)
    await live.send_json_to({"type": "resume", "after": 0})
    await start(conversation)
    frames = await receive_until(live, carries_result)
    await live.disconnect()
    stored = await database_sync_to_async(
        lambda: [
            (e.cursor, e.payload)
            for e in RunEvent.objects.filter(conversation=conversation).order_by("cursor")
        ]
    )()
    assert not [m for m in frames if m["type"] == "run.event"]
    received = [
        (e["cursor"], e["event"]) for m in frames if m["type"] == "run.events" for e in m["events"]
    ]
    assert received == stored
    assert "".join(p.get("text", "") for _, p in stored if p["type"] == "delta") == "".join(
        f"{n} " for n in range(1, 301)
    )

    replay = await connect(conversation, path=path)
    await replay.send_json_to({"type": "resume", "after": 0})
    page = await receive_until(replay, lambda m: m["type"] == "run.events")
    await replay.disconnect()
    assert [(e["cursor"], e["event"]) for e in page[-1]["events"]] == stored  # one page


async def test_resume_after_zero_replays_a_finished_run_from_the_database(fake_worker):
    conversation = await conversation_with_mode("flood 50")
    run = await start(conversation)
    await database_sync_to_async(wait_for)(
        lambda: Run.objects.filter(id=run.id, status=Run.Status.DONE).exists(), what="run done"
    )
    tab = await connect(conversation)
    await tab.send_json_to({"type": "resume", "after": 0})
    replay = await receive_until(tab, is_result)
    await tab.disconnect()
    stored = await database_sync_to_async(
        lambda: list(
            RunEvent.objects.filter(conversation=conversation)
            .order_by("cursor")
            .values_list("cursor", flat=True)
        )
    )()
    assert [m["cursor"] for m in replay if m["type"] == "run.event"] == stored


@database_sync_to_async
def pending_approval(conversation) -> Approval:
    return wait_for(
        lambda: Approval.objects.filter(
            conversation=conversation, status=Approval.Status.PENDING
        ).first(),
        what="a pending approval",
    )


@database_sync_to_async
def finished_run(run) -> Run:
    return wait_for(
        lambda: Run.objects.filter(id=run.id, status__in=Run.FINISHED_STATUSES).first(),
        what="run end",
    )


async def test_an_approval_raised_with_no_tab_open_is_delivered_on_connect_and_answered_once(
    fake_worker,
):
    conversation = await conversation_with_mode("confirm")
    run = await start(conversation)
    approval = await pending_approval(conversation)
    tab_a = await connect(conversation)
    request = await receive_until(tab_a, lambda m: m["type"] == "agent_confirm_request")
    assert request[-1]["approval_id"] == str(approval.id)
    assert request[-1]["kind"] == "confirm" and request[-1]["prompt"] == "Run shell: rm -rf build/"
    await tab_a.disconnect()

    tab_b = await connect(conversation)
    await receive_until(tab_b, lambda m: m["type"] == "agent_confirm_request")
    await tab_b.send_json_to(
        {"type": "agent_confirm_response", "approval_id": str(approval.id), "approved": True}
    )
    resolved = await receive_until(tab_b, lambda m: m["type"] == "agent_confirm_resolved")
    assert resolved[-1]["status"] == "approved" and resolved[-1]["decided_by"] == "user"
    await tab_b.send_json_to(
        {"type": "agent_confirm_response", "approval_id": str(approval.id), "approved": False}
    )
    refused = await receive_until(tab_b, lambda m: m["type"] == "error")
    assert refused[-1]["code"] == "approval_closed"
    await tab_b.disconnect()

    run = await finished_run(run)
    assert run.status == Run.Status.DONE and run.answer == "answer: yes"
    decided = await database_sync_to_async(Approval.objects.get)(id=approval.id)
    assert (decided.status, decided.via, decided.decided_by_user_id) == (
        "approved",
        "websocket",
        conversation.user_id,
    )
    violations = await database_sync_to_async(
        RunEvent.objects.filter(conversation=conversation, type="policy_violation").count
    )()
    assert violations == 0  # the shell call was covered by the approved confirm


async def test_a_declined_confirm_is_sent_as_no(fake_worker):
    conversation = await conversation_with_mode("confirm")
    run = await start(conversation)
    approval = await pending_approval(conversation)
    tab = await connect(conversation)
    await tab.send_json_to(
        {"type": "agent_confirm_response", "approval_id": str(approval.id), "approved": False}
    )
    await receive_until(
        tab, lambda m: m["type"] == "agent_confirm_resolved" and m["status"] == "declined"
    )
    await tab.disconnect()
    run = await finished_run(run)
    assert run.answer == "answer: no"


async def test_an_unanswered_confirm_is_declined_at_its_deadline_and_the_agent_goes_on(worker_node):
    worker_node.use(FAKE, PAW_SANDBOX_ISOLATION="none", PAW_APPROVAL_TIMEOUT_SECONDS="1")
    conversation = await conversation_with_mode("confirm")
    with_deadline = await start(conversation)
    approval = await pending_approval(conversation)
    run = await finished_run(with_deadline)
    assert run.status == Run.Status.DONE and run.answer == "answer: no"
    expired = await database_sync_to_async(Approval.objects.get)(id=approval.id)
    assert (expired.status, expired.decided_by) == ("expired", "timeout")


async def test_an_unanswered_question_is_answered_unanswered(worker_node):
    worker_node.use(FAKE, PAW_SANDBOX_ISOLATION="none", PAW_APPROVAL_TIMEOUT_SECONDS="1")
    conversation = await conversation_with_mode("question")
    run = await finished_run(await start(conversation))
    assert run.answer == "answer: Unanswered"


async def test_auto_approve_approves_confirms_without_asking(fake_worker):
    conversation = await conversation_with_mode("confirm", auto_approve=True)
    run = await finished_run(await start(conversation))
    assert run.status == Run.Status.DONE and run.answer == "answer: yes"
    approval = await database_sync_to_async(Approval.objects.get)(run=run)
    assert (approval.status, approval.decided_by, approval.via) == ("approved", "auto", "auto")


async def test_questions_still_go_to_the_person_under_auto_approve(fake_worker):
    conversation = await conversation_with_mode("question", auto_approve=True)
    run = await start(conversation)
    approval = await pending_approval(conversation)
    tab = await connect(conversation)
    request = await receive_until(tab, lambda m: m["type"] == "agent_confirm_request")
    assert request[-1]["questions"][0]["options"][0] == "tips.csv"
    await tab.send_json_to(
        {"type": "agent_confirm_response", "approval_id": str(approval.id), "answers": ["tips.csv"]}
    )
    await receive_until(tab, lambda m: m["type"] == "agent_confirm_resolved")
    await tab.disconnect()
    run = await finished_run(run)
    assert run.answer == "answer: tips.csv"


async def test_a_runtime_that_runs_a_gated_tool_without_asking_is_stopped(fake_worker):
    conversation = await conversation_with_mode("lying")
    tab = await connect(conversation)
    await tab.send_json_to({"type": "resume", "after": 0})
    run = await start(conversation)
    seen = await receive_until(tab, lambda m: m["type"] == "run.status" and m["status"] == "error")
    await tab.disconnect()
    violation = [
        m for m in seen if m["type"] == "run.event" and m["event"]["type"] == "policy_violation"
    ]
    assert violation and violation[0]["event"]["tools"] == ["shell"]
    run = await finished_run(run)
    assert run.errors[0]["code"] == "policy_violation"
    # The conversation stays usable.
    await database_sync_to_async((workspace_ensure(conversation.id) / "fake_mode").write_text)(
        "flood 3"
    )
    again = await finished_run(await start(conversation, "again"))
    assert again.status == Run.Status.DONE


async def test_cancel_from_the_socket_ends_the_run(fake_worker):
    conversation = await conversation_with_mode("flood 2000 0.01")
    tab = await connect(conversation)
    run = await start(conversation)
    await receive_until(tab, lambda m: m["type"] == "run.status" and m["status"] == "running")
    await tab.send_json_to({"type": "run.cancel", "run_id": str(run.id)})
    seen = await receive_until(
        tab, lambda m: m["type"] == "run.status" and m["status"] in Run.FINISHED_STATUSES
    )
    await tab.disconnect()
    assert seen[-1]["status"] == "cancelled", seen[-1]
    assert (await finished_run(run)).status == Run.Status.CANCELLED


async def close_code(conversation_id, headers, path_suffix="") -> int:
    communicator = websocket_tab(f"/ws/conversations/{conversation_id}/{path_suffix}", headers)
    connected, _ = await communicator.connect()
    assert connected
    output = await communicator.receive_output(timeout=5)
    assert output["type"] == "websocket.close"
    await communicator.disconnect()  # the consumer ends: no task left pending at the loop's end
    return output["code"]


async def test_sockets_without_a_user_another_users_or_unknown_conversations_are_closed(db):
    """Another user's conversation is "no such conversation" (4404), as the REST API's 404
    for it: ids cannot be probed."""
    conversation = await database_sync_to_async(ConversationFactory)()
    origin = [(b"origin", b"http://localhost")]
    assert await close_code(conversation.id, origin) == 4401
    stranger = await database_sync_to_async(UserFactory)()
    cookie = [(b"cookie", f"sessionid={await session_cookie(stranger)}".encode())]
    assert await close_code(conversation.id, origin + cookie) == 4404
    assert await close_code("00000000-0000-0000-0000-000000000000", origin + cookie) == 4404
    assert await close_code("not-a-uuid", origin + cookie) == 4404


async def test_a_jwt_in_the_query_or_subprotocol_authenticates_integrations(db):
    conversation = await database_sync_to_async(ConversationFactory)()
    token = (await database_sync_to_async(auth_token_pair_for)(user=conversation.user))["access"]
    origin = [(b"origin", b"http://localhost")]
    via_query = websocket_tab(f"/ws/conversations/{conversation.id}/?token={token}", origin)
    assert (await via_query.connect())[0]
    await via_query.send_json_to({"type": "ping"})
    assert await via_query.receive_json_from() == {"type": "pong"}
    await via_query.disconnect()
    via_protocol = websocket_tab(
        f"/ws/conversations/{conversation.id}/", origin, subprotocols=["paw", token]
    )
    connected, subprotocol = await via_protocol.connect()
    assert connected and subprotocol == "paw"
    await via_protocol.send_json_to({"type": "ping"})
    assert await via_protocol.receive_json_from() == {"type": "pong"}
    await via_protocol.disconnect()
    assert await close_code(conversation.id, origin, "?token=not-a-token") == 4401
    stranger = await database_sync_to_async(UserFactory)()
    stranger_token = (await database_sync_to_async(auth_token_pair_for)(user=stranger))["access"]
    assert await close_code(conversation.id, origin, f"?token={stranger_token}") == 4404
    # A revoked token (the user logged out everywhere) is refused.
    await database_sync_to_async(auth_tokens_revoke)(user=conversation.user)
    assert await close_code(conversation.id, origin, f"?token={token}") == 4401


async def test_revoking_tokens_closes_the_sockets_opened_with_them(db):
    """A logout (tokens revoked) closes the user's token sockets at once, before their next
    message; the browser session's socket and other users' sockets stay. A password change
    ends the sessions too, and closes their sockets."""
    conversation = await database_sync_to_async(ConversationFactory)()
    user = await database_sync_to_async(lambda: conversation.user)()
    origin = [(b"origin", b"http://localhost")]

    async def by_token():
        token = (await database_sync_to_async(auth_token_pair_for)(user=user))["access"]
        tab = websocket_tab(f"/ws/conversations/{conversation.id}/?token={token}", origin)
        assert (await tab.connect())[0]
        return tab

    integration, browser = await by_token(), await connect(conversation)
    other = await connect(await database_sync_to_async(ConversationFactory)())
    await database_sync_to_async(auth_tokens_revoke)(user=user)
    assert await integration.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
    for tab in (browser, other):
        await tab.send_json_to({"type": "ping"})
        assert await tab.receive_json_from() == {"type": "pong"}
    integration = await by_token()
    await database_sync_to_async(user.set_password)("a new long passphrase 42")
    await database_sync_to_async(user.save)()
    await database_sync_to_async(auth_tokens_revoke)(user=user, sessions_too=True)
    for tab in (integration, browser):
        assert await tab.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
    await other.send_json_to({"type": "ping"})
    assert await other.receive_json_from() == {"type": "pong"}
    for tab in (integration, browser, other):
        await tab.disconnect()


async def test_deleting_a_conversation_closes_its_open_sockets(db):
    conversation = await database_sync_to_async(ConversationFactory)()
    other = await database_sync_to_async(ConversationFactory)()
    tab, elsewhere = await connect(conversation), await connect(other)
    user = await database_sync_to_async(lambda: conversation.user)()
    client = Client()
    await database_sync_to_async(client.force_login)(user)
    response = await database_sync_to_async(client.delete)(f"/api/conversations/{conversation.id}")
    assert response.status_code == 204
    assert await tab.receive_output(timeout=5) == {"type": "websocket.close", "code": 4404}
    await elsewhere.send_json_to({"type": "ping"})
    assert await elsewhere.receive_json_from() == {"type": "pong"}
    for socket in (tab, elsewhere):
        await socket.disconnect()


async def test_signing_out_closes_that_sessions_sockets_only(db):
    conversation = await database_sync_to_async(ConversationFactory)()
    user = await database_sync_to_async(lambda: conversation.user)()
    leaving, staying = Client(), Client()
    for client in (leaving, staying):
        await database_sync_to_async(client.force_login)(user)

    gone, kept = [
        await connect(conversation, sessionid=client.cookies["sessionid"].value)
        for client in (leaving, staying)
    ]
    response = await database_sync_to_async(leaving.post)("/accounts/logout/")
    assert response.status_code == 302
    assert await gone.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
    await kept.send_json_to({"type": "ping"})  # another browser of the same person stays
    assert await kept.receive_json_from() == {"type": "pong"}
    await kept.disconnect()


async def test_an_event_whose_live_message_was_lost_still_reaches_a_live_client(db):
    """The channel layer drops messages for a channel far behind; a dropped last message
    leaves no later cursor to show the gap. Stored but never sent (what such a loss looks
    like), the event still arrives, once the connection has been quiet a moment."""
    from conversations.services.events import EventDraft, events_append

    conversation = await database_sync_to_async(ConversationFactory)()
    tab = await connect(conversation)
    await tab.send_json_to({"type": "resume", "after": 0})
    await tab.send_json_to({"type": "ping"})
    assert await tab.receive_json_from() == {"type": "pong"}  # the resume is done: live
    payload = {"type": "notice", "level": "info", "code": "lost", "message": "sent, then lost"}
    draft = EventDraft(run_id=None, type="notice", kind="lost", payload=payload)
    await database_sync_to_async(events_append)(conversation_id=conversation.id, drafts=[draft])
    [message] = await receive_until(tab, lambda m: m["type"] == "run.event", timeout=10)
    assert (message["cursor"], message["event"]) == (1, payload)
    await tab.send_json_to({"type": "ping"})
    assert await tab.receive_json_from() == {"type": "pong"}  # nothing sent twice
    await tab.disconnect()


async def test_a_cursor_in_other_digits_is_refused_not_a_crash(db):
    conversation = await database_sync_to_async(ConversationFactory)()
    for after in ("%C2%B2", "%D9%A3", "-1", "9" * 30):
        tab = await connect(
            conversation, path=f"/ws/conversations/{conversation.id}/?after={after}"
        )
        reply = await tab.receive_json_from()
        assert (reply["type"], reply["code"]) == ("error", "invalid"), after
        await tab.send_json_to({"type": "ping"})
        assert await tab.receive_json_from() == {"type": "pong"}
        await tab.disconnect()


async def test_bad_messages_get_an_error_and_the_socket_stays_usable(db):
    conversation = await database_sync_to_async(ConversationFactory)()
    tab = await connect(conversation)
    cases = [
        ("not json", "bad_json"),
        # Deeper than Python's JSON parser recurses (it raised RecursionError: 1011).
        ("[" * 30_000, "bad_json"),
        ("[" * 30_000 + "]" * 30_000, "bad_json"),
        ('{"type": "resume", "after": ' + '{"a":' * 12_000, "bad_json"),
        ("[1, 2]", "bad_message"),
        (json.dumps({"type": "launch_missiles"}), "unknown_type"),
        (json.dumps({"type": "resume", "after": "ten"}), "invalid"),
        (json.dumps({"type": "resume", "after": -1}), "invalid"),
        (json.dumps({"type": "x", "pad": "a" * 70_000}), "too_large"),
        (
            json.dumps({"type": "agent_confirm_response", "approval_id": "nope", "approved": True}),
            "not_found",
        ),
        (
            json.dumps({"type": "run.cancel", "run_id": "00000000-0000-0000-0000-000000000000"}),
            "not_found",
        ),
    ]
    for text, code in cases:
        await tab.send_to(text_data=text)
        reply = await tab.receive_json_from()
        assert (reply["type"], reply["code"]) == ("error", code), text[:40]
        assert reply["detail"]
    await tab.send_json_to({"type": "ping"})
    assert await tab.receive_json_from() == {"type": "pong"}
    await tab.disconnect()


async def test_a_flood_of_client_messages_is_rate_limited(db):
    conversation = await database_sync_to_async(ConversationFactory)()
    tab = await connect(conversation)
    for _ in range(60):
        await tab.send_json_to({"type": "ping"})
    replies = [await tab.receive_json_from() for _ in range(60)]
    assert {
        "type": "error",
        "code": "rate_limited",
        "detail": "Too many messages; slow down.",
    } in replies
    assert replies[0] == {"type": "pong"}
    await tab.disconnect()
