"""The conversation websocket end to end: a real Celery worker running the real paw-agent
runtime against the scripted model, followed with ``WebsocketCommunicator`` (issue 6).

Streams survive a reconnect exactly once, tabs see the same sequence, approvals are
decided once whichever tab or API call comes first, deadlines and auto-approve decide on
their own, declined gated actions never happen, cancels end runs ``cancelled``, and a
foreign Origin is refused."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator

from conversations.models import Approval, Conversation, Run, RunEvent
from conversations.services.workspaces import workspace_ensure
from paw_project.asgi import application
from tests.conftest import PAW_AGENT, SCRIPTED_API_KEY, api_client_for
from tests.conversations.test_websocket import (
    connect,
    deltas,
    finished_run,
    is_result,
    pending_approval,
    receive_until,
    session_cookie,
    start,
)
from tests.factories import ConversationFactory

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


#: "1 2 3 … 400 ", streamed four characters per delta (373 deltas).
NUMBERS = "".join(f"{n} " for n in range(1, 401))
#: Generous: the worker, the runtime and the model server share two cores with others.
WAIT = 60
FINISHED = ("done", "error", "cancelled")


def delete_script(*paths: str) -> dict:
    """One model round asking to delete ``paths`` (each a gated confirm), then an answer
    quoting the last tool result."""
    return {
        "api_key": SCRIPTED_API_KEY,
        "responses": [
            {"tool_calls": [{"name": "delete_file", "arguments": {"path": p}} for p in paths]},
            "Finished: {{tool_result}}",
        ],
    }


def stream_script(text: str, *, chunk: int, chunk_delay: float) -> dict:
    return {
        "api_key": SCRIPTED_API_KEY,
        "responses": [{"text": text, "chunk": chunk, "chunk_delay": chunk_delay}],
    }


@database_sync_to_async
def conversation_with_files(*names: str, **fields) -> Conversation:
    conversation = ConversationFactory(**fields)
    workspace = workspace_ensure(conversation.id)
    for name in names:
        (workspace / name).write_text(f"precious {name}")
    return conversation


def workspace_has(conversation: Conversation, name: str) -> bool:
    return (workspace_ensure(conversation.id) / name).exists()


@database_sync_to_async
def stored(conversation: Conversation, **filters) -> list[RunEvent]:
    return list(RunEvent.objects.filter(conversation=conversation, **filters).order_by("cursor"))


@database_sync_to_async
def approval_of(approval_id) -> Approval:
    return Approval.objects.get(id=approval_id)


def of_type(messages: list[dict], message_type: str) -> list[dict]:
    return [m for m in messages if m["type"] == message_type]


def run_events(messages: list[dict]) -> list[tuple[int, dict]]:
    return [(m["cursor"], m["event"]) for m in messages if m["type"] == "run.event"]


def is_status(*statuses: str):
    return lambda m: m["type"] == "run.status" and m["status"] in statuses


def is_resolved(message: dict) -> bool:
    return message["type"] == "agent_confirm_resolved"


def is_request(message: dict) -> bool:
    return message["type"] == "agent_confirm_request"


async def until_result_and_status(tab: WebsocketCommunicator) -> list[dict]:
    """Messages until both the run's ``result`` event and its final ``run.status``."""
    messages = await receive_until(tab, is_result, timeout=WAIT)
    if not any(is_status(*FINISHED)(m) for m in messages):
        messages += await receive_until(tab, is_status(*FINISHED), timeout=WAIT)
    return messages


async def live_tab(conversation: Conversation) -> WebsocketCommunicator:
    """A tab that has everything from the start (``resume {after: 0}``)."""
    tab = await connect(conversation)
    await tab.send_json_to({"type": "resume", "after": 0})
    # Answered once the consumer has joined the group and sent what was pending (nothing).
    await tab.send_json_to({"type": "ping"})
    assert await tab.receive_json_from(timeout=WAIT) == {"type": "pong"}
    return tab


# --- streaming ------------------------------------------------------------------------


async def test_a_client_that_reconnects_with_resume_gets_every_number_once_in_order(
    celery_worker, scripted_model
):
    scripted_model.load(stream_script(NUMBERS, chunk=4, chunk_delay=0.01))
    conversation = await database_sync_to_async(ConversationFactory)()
    first = await live_tab(conversation)
    run = await start(conversation, "Count to 400")
    seen: list[dict] = []
    while sum(1 for _, event in run_events(seen) if event["type"] == "delta") < 100:
        seen.append(await first.receive_json_from(timeout=WAIT))
    await first.disconnect()
    last_cursor = max(cursor for cursor, _ in run_events(seen))

    second = await connect(conversation)
    await second.send_json_to({"type": "resume", "after": last_cursor})
    rest = await receive_until(second, is_result, timeout=WAIT)
    await second.disconnect()

    text = deltas(seen) + deltas(rest)
    assert [int(n) for n in text.split()] == list(range(1, 401))
    assert text == NUMBERS
    cursors = [cursor for cursor, _ in run_events(seen + rest)]
    assert cursors == sorted(set(cursors)), "a cursor came twice or out of order"
    assert min(cursor for cursor, _ in run_events(rest)) == last_cursor + 1
    assert (await finished_run(run)).status == Run.Status.DONE
    assert [e.cursor for e in await stored(conversation)] == cursors


async def test_two_tabs_receive_identical_event_sequences_from_the_real_runtime(
    celery_worker, scripted_model
):
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [
                {"tool_calls": [{"name": "write_file", "arguments": {"path": "notes.txt", "content": "hi"}}]},
                {"text": "Saved: {{tool_result}}. " + NUMBERS[:600], "chunk": 3, "chunk_delay": 0.002},
            ],
        }
    )  # fmt: skip
    conversation = await database_sync_to_async(ConversationFactory)()
    tabs = [await live_tab(conversation), await live_tab(conversation)]
    await start(conversation, "Write notes.txt")
    received = [await until_result_and_status(tab) for tab in tabs]
    for tab in tabs:
        await tab.disconnect()

    first, second = (run_events(r) for r in received)
    assert first == second
    assert {event["type"] for _, event in first} >= {"start", "notify", "delta", "result"}
    assert deltas(received[0]).startswith("Saved: wrote 2 bytes to notes.txt. 1 2 3 ")
    assert [(e.cursor, e.payload) for e in await stored(conversation)] == first
    statuses = [[m["status"] for m in of_type(r, "run.status")] for r in received]
    assert statuses[0] == statuses[1]
    # (queued is told after the run is handed to the worker, so it may come second)
    assert sorted(statuses[0]) == ["done", "queued", "running", "starting"]
    assert statuses[0][-1] == "done"


# --- approvals ------------------------------------------------------------------------


async def test_an_approval_raised_with_no_tab_open_reaches_a_later_tab_and_is_decided_once(
    celery_worker, scripted_model
):
    scripted_model.load(delete_script("old.txt"))
    conversation = await conversation_with_files("old.txt")
    run = await start(conversation, "Delete old.txt")
    approval = await pending_approval(conversation)  # nobody is watching yet

    tab_a = await connect(conversation)
    request = (await receive_until(tab_a, is_request, timeout=WAIT))[-1]
    assert (request["approval_id"], request["run_id"], request["kind"]) == (
        str(approval.id),
        str(run.id),
        "confirm",
    )
    assert request["prompt"].startswith("delete_file: delete the file old.txt")
    await tab_a.disconnect()
    assert workspace_has(conversation, "old.txt")

    tab_b = await connect(conversation)
    await receive_until(tab_b, lambda m: is_request(m) and m["approval_id"] == str(approval.id))
    await tab_b.send_json_to(
        {"type": "agent_confirm_response", "approval_id": str(approval.id), "approved": True}
    )
    resolved = (await receive_until(tab_b, is_resolved, timeout=WAIT))[-1]
    assert (resolved["approval_id"], resolved["status"], resolved["decided_by"]) == (
        str(approval.id),
        "approved",
        "user",
    )
    await tab_b.send_json_to(
        {"type": "agent_confirm_response", "approval_id": str(approval.id), "approved": False}
    )
    refused = (await receive_until(tab_b, lambda m: m["type"] == "error"))[-1]
    assert refused["code"] == "approval_closed"
    await tab_b.disconnect()

    run = await finished_run(run)
    assert run.status == Run.Status.DONE, run.errors
    assert run.answer == "Finished: deleted old.txt"
    assert not workspace_has(conversation, "old.txt")
    decided = await approval_of(approval.id)
    assert (decided.status, decided.decided_by, decided.via, decided.decided_by_user_id) == (
        "approved",
        "user",
        "websocket",
        conversation.user_id,
    )
    assert not await stored(conversation, type="policy_violation")


async def test_a_declined_delete_never_happens_and_every_open_tab_sees_the_decision(
    celery_worker, scripted_model
):
    scripted_model.load(delete_script("keep.txt"))
    conversation = await conversation_with_files("keep.txt")
    tabs = [await live_tab(conversation), await live_tab(conversation)]
    run = await start(conversation, "Delete keep.txt")
    requests = [(await receive_until(tab, is_request, timeout=WAIT))[-1] for tab in tabs]
    assert requests[0] == requests[1]
    approval_id = requests[0]["approval_id"]
    await tabs[1].send_json_to(
        {"type": "agent_confirm_response", "approval_id": approval_id, "approved": False}
    )
    for tab in tabs:
        resolved = (await receive_until(tab, is_resolved, timeout=WAIT))[-1]
        assert (resolved["approval_id"], resolved["status"], resolved["decided_by"]) == (
            approval_id,
            "declined",
            "user",
        )
    seen = await receive_until(tabs[0], is_result, timeout=WAIT)
    for tab in tabs:
        await tab.disconnect()

    run = await finished_run(run)
    assert run.status == Run.Status.DONE, run.errors
    assert run.answer == "Finished: declined by the user"
    keep = workspace_ensure(conversation.id) / "keep.txt"
    assert keep.read_text() == "precious keep.txt"
    tool_calls = [e for _, e in run_events(seen) if e.get("kind") == "tool_calls"]
    assert tool_calls == []  # the delete was never announced, let alone run
    assert not await stored(conversation, type="policy_violation")


async def test_an_api_decision_racing_a_websocket_decision_is_taken_exactly_once(
    celery_worker, scripted_model
):
    """Three confirms of one run; each time the API approves while the tab declines: the
    API first, the tab first, then both at the same moment. The row lock lets exactly one
    through; the loser gets 409 or ``error approval_closed``; every decision reaches the
    tab once, and the runtime acts on the winner's decision only."""
    rounds = {"a.txt": "api first", "b.txt": "websocket first", "c.txt": "together"}
    scripted_model.load(delete_script(*rounds))
    conversation = await conversation_with_files(*rounds)
    user = await database_sync_to_async(lambda: conversation.user)()
    tab = await live_tab(conversation)

    def api_approve(approval_id: str) -> tuple[int, dict]:
        response = api_client_for(user).post(
            f"/api/approvals/{approval_id}/decision", {"approved": True}, format="json"
        )
        return response.status_code, response.json()

    # Off the thread the consumer's database calls use, so the two really overlap.
    post_approval = sync_to_async(api_approve, thread_sensitive=False)
    messages: list[dict] = []

    async def until_pong(count: int) -> None:
        """Collect until the ``count``-th pong: the tab's earlier messages are handled."""
        while len(of_type(messages, "pong")) < count:
            messages.append(await tab.receive_json_from(timeout=WAIT))

    run = await start(conversation, "Delete the three files")
    api_won = {}
    for name, mode in rounds.items():
        while not of_type(messages, "agent_confirm_request"):
            messages.append(await tab.receive_json_from(timeout=WAIT))
        request = of_type(messages, "agent_confirm_request")[0]
        messages = messages[messages.index(request) + 1 :]
        approval_id = request["approval_id"]
        assert name in request["prompt"]
        decline = {"type": "agent_confirm_response", "approval_id": approval_id, "approved": False}
        if mode == "api first":
            status_code, body = await post_approval(approval_id)
            await tab.send_json_to(decline)
        elif mode == "websocket first":
            await tab.send_json_to(decline)
            await tab.send_json_to({"type": "ping"})
            await until_pong(1)
            status_code, body = await post_approval(approval_id)
        else:
            _, (status_code, body) = await asyncio.gather(
                tab.send_json_to(decline), post_approval(approval_id)
            )
        await tab.send_json_to({"type": "ping"})  # answered after the decision's reply
        await until_pong(2 if mode == "websocket first" else 1)
        while not any(is_resolved(m) for m in messages):
            messages.append(await tab.receive_json_from(timeout=WAIT))
        replies = [m for m in messages if not is_request(m)]
        messages = [m for m in messages if is_request(m)]  # the next confirm may be here

        api_won[name] = status_code == 200
        errors = [m["code"] for m in of_type(replies, "error")]
        if api_won[name]:
            assert (body["status"], body["via"]) == ("approved", "api")
            assert errors == ["approval_closed"]
        else:
            assert (status_code, body["code"]) == (409, "approval_closed")
            assert errors == []
        resolved = [
            (m["approval_id"], m["status"]) for m in of_type(replies, "agent_confirm_resolved")
        ]
        assert resolved == [(approval_id, "approved" if api_won[name] else "declined")]
        decided = await approval_of(approval_id)
        assert (decided.status, decided.via) == (
            ("approved", "api") if api_won[name] else ("declined", "websocket")
        )
    run = await finished_run(run)
    await tab.disconnect()

    assert (api_won["a.txt"], api_won["b.txt"]) == (True, False)
    assert run.status == Run.Status.DONE, run.errors
    assert {name: not workspace_has(conversation, name) for name in rounds} == api_won
    assert not await stored(conversation, type="policy_violation")


async def test_auto_approve_approves_a_gated_delete_without_asking_anyone(
    celery_worker, scripted_model
):
    scripted_model.load(delete_script("old.txt"))
    conversation = await conversation_with_files("old.txt", auto_approve=True)
    tab = await live_tab(conversation)
    run = await start(conversation, "Delete old.txt")
    seen = await until_result_and_status(tab)  # the tab never answers
    await tab.disconnect()

    run = await finished_run(run)
    assert run.status == Run.Status.DONE, run.errors
    assert run.answer == "Finished: deleted old.txt"
    assert not workspace_has(conversation, "old.txt")
    approval = await database_sync_to_async(Approval.objects.get)(run=run)
    assert (approval.status, approval.decided_by, approval.via, approval.decided_by_user_id) == (
        "approved",
        "auto",
        "auto",
        None,
    )
    resolved = of_type(seen, "agent_confirm_resolved")
    assert [(r["approval_id"], r["status"], r["decided_by"]) for r in resolved] == [
        (str(approval.id), "approved", "auto")
    ]
    assert of_type(seen, "agent_confirm_request") == []  # nobody was asked
    assert not await stored(conversation, type="policy_violation")


# --- cancel ---------------------------------------------------------------------------


async def test_cancel_from_the_socket_during_a_streaming_run_ends_it_cancelled(
    celery_worker, scripted_model
):
    scripted_model.load(stream_script("tick " * 2000, chunk=5, chunk_delay=0.01))
    conversation = await database_sync_to_async(ConversationFactory)()
    tab = await live_tab(conversation)
    run = await start(conversation, "Tick for a long time")
    await receive_until(
        tab, lambda m: m["type"] == "run.event" and m["event"]["type"] == "delta", timeout=WAIT
    )
    await tab.send_json_to({"type": "run.cancel", "run_id": str(run.id)})
    seen = await receive_until(tab, is_status(*FINISHED), timeout=WAIT)
    await tab.disconnect()

    assert seen[-1]["status"] == "cancelled", seen[-1]
    assert of_type(seen, "error") == []
    run = await finished_run(run)
    assert run.status == Run.Status.CANCELLED, run.errors
    assert deltas(seen).count("tick") < 2000  # it stopped mid-stream


async def test_cancel_of_a_running_run_through_the_api_ends_it_cancelled(
    celery_worker, scripted_model
):
    scripted_model.load(stream_script("tock " * 2000, chunk=5, chunk_delay=0.01))
    conversation = await database_sync_to_async(ConversationFactory)()
    user = await database_sync_to_async(lambda: conversation.user)()
    tab = await live_tab(conversation)
    run = await start(conversation, "Tock for a long time")
    await receive_until(
        tab, lambda m: m["type"] == "run.event" and m["event"]["type"] == "delta", timeout=WAIT
    )
    running = await database_sync_to_async(Run.objects.get)(id=run.id)
    assert running.status == Run.Status.RUNNING
    response = await database_sync_to_async(
        lambda: api_client_for(user).post(
            f"/api/conversations/{conversation.id}/runs/{run.id}/cancel"
        )
    )()
    assert response.status_code == 202, response.json()
    seen = await receive_until(tab, is_status(*FINISHED), timeout=WAIT)
    await tab.disconnect()

    assert seen[-1]["status"] == "cancelled", seen[-1]
    assert (await finished_run(run)).status == Run.Status.CANCELLED


# --- origin ---------------------------------------------------------------------------


async def test_a_foreign_origin_is_refused(db):
    conversation = await database_sync_to_async(ConversationFactory)()
    user = await database_sync_to_async(lambda: conversation.user)()
    cookie = (b"cookie", f"sessionid={await session_cookie(user)}".encode())
    path = f"/ws/conversations/{conversation.id}/"
    for origin in (b"https://evil.example", b"http://localhost.evil.example"):
        foreign = WebsocketCommunicator(application, path, [(b"origin", origin), cookie])
        connected, _ = await foreign.connect()
        assert not connected, origin
        await foreign.disconnect()
    # The same cookie from the site's own origin is let in.
    same = WebsocketCommunicator(application, path, [(b"origin", b"http://localhost"), cookie])
    assert (await same.connect())[0]
    await same.send_json_to({"type": "ping"})
    assert await same.receive_json_from() == {"type": "pong"}
    await same.disconnect()


# --- deadlines (last: it restarts the worker with a short approval timeout) ------------


async def test_an_unanswered_delete_is_declined_at_its_deadline_and_the_agent_goes_on(
    worker_node, scripted_model, settings
):
    worker_node.use(PAW_AGENT, PAW_APPROVAL_TIMEOUT_SECONDS="2")
    settings.PAW_APPROVAL_TIMEOUT_SECONDS = 2
    scripted_model.load(delete_script("keep.txt"))
    conversation = await conversation_with_files("keep.txt")
    tab = await live_tab(conversation)
    run = await start(conversation, "Delete keep.txt")
    request = (await receive_until(tab, is_request, timeout=WAIT))[-1]
    resolved = (await receive_until(tab, is_resolved, timeout=WAIT))[-1]  # nobody answers
    assert (resolved["approval_id"], resolved["status"], resolved["decided_by"]) == (
        request["approval_id"],
        "expired",
        "timeout",
    )
    await receive_until(tab, is_result, timeout=WAIT)
    await tab.disconnect()

    run = await finished_run(run)
    assert run.status == Run.Status.DONE, run.errors
    assert run.answer == "Finished: declined by the user"  # the agent went on
    assert workspace_has(conversation, "keep.txt")
    expired = await approval_of(request["approval_id"])
    assert (expired.status, expired.decided_by, expired.via) == ("expired", "timeout", "timeout")
    assert expired.expires_at - expired.created_at == timedelta(seconds=2)
    assert expired.decided_by_user_id is None
