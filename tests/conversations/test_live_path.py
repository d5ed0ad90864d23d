"""The live path (docs/api.md, "The live path"): in Redis mode an event reaches the
websockets from the conversation's live log the moment it has its cursor, and is stored
in PostgreSQL right after. Its failure cases, with the real worker, runtime processes,
Redis, PostgreSQL and websocket consumer: the store held up or its worker killed between
the two, the live log lost (as on a Redis restart), the web process's subscription
broken, and clients resuming across each."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from contextlib import contextmanager
from uuid import UUID

import psycopg
import pytest
import redis
from channels.db import database_sync_to_async
from django.conf import settings
from django.db import transaction
from django.test import Client
from prometheus_client import REGISTRY

from conversations.models import Conversation, RunEvent
from conversations.selectors.events import conversation_cursor
from conversations.services.events import (
    EventDraft,
    events_append,
    events_reconcile,
    events_relay,
    events_store,
)
from paw_project import live_log
from tests.conversations.test_websocket import (
    connect,
    conversation_with_mode,
    deltas,
    is_result,
    receive_until,
    start,
)
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.processes import worker_database_url
from tests.sandboxes.scenarios import FAKE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@contextmanager
def events_table_locked():
    """Hold the run events' table so no event can be stored (``SHARE`` mode: reads go on,
    ``COPY`` and ``INSERT`` wait) until the block ends."""
    with psycopg.connect(worker_database_url()) as held:
        held.execute(f"LOCK TABLE {RunEvent._meta.db_table} IN SHARE MODE")
        yield
        held.rollback()


def stored_cursors(conversation_id) -> list[int]:
    return list(
        RunEvent.objects.filter(conversation_id=conversation_id)
        .order_by("cursor")
        .values_list("cursor", flat=True)
    )


def numbers(messages) -> list[int]:
    return [int(n) for n in deltas(messages).split()]


def draft(text: str) -> EventDraft:
    return EventDraft(run_id=None, type="notice", kind="test", payload={"type": "notice", "message": text})


async def resume_all(conversation, after: int = 0) -> list[dict]:
    """Every event a new tab gets when it resumes after ``after``, until the run's result."""
    tab = await connect(conversation)
    await tab.send_json_to({"type": "resume", "after": after})
    try:
        return await receive_until(tab, is_result)
    finally:
        await tab.disconnect()


async def test_events_reach_the_socket_while_the_database_cannot_store_them(fake_worker):
    conversation = await conversation_with_mode("flood 50 0.002")
    tab = await connect(conversation)
    await tab.send_json_to({"type": "resume", "after": 0})
    with events_table_locked():
        await start(conversation)
        live = await receive_until(tab, is_result)
        assert await database_sync_to_async(stored_cursors)(conversation.id) == []
        # The REST API reads the live log too: the events are listed before they are stored.
        client = Client()
        await database_sync_to_async(client.force_login)(conversation.user)
        listed = await database_sync_to_async(client.get)(
            f"/api/conversations/{conversation.id}/events?limit=1000"
        )
        assert [e["cursor"] for e in listed.json()["events"]] == [
            m["cursor"] for m in live if m["type"] == "run.event"
        ]
    await tab.disconnect()
    assert numbers(live) == list(range(1, 51))
    cursors = [m["cursor"] for m in live if m["type"] == "run.event"]
    assert cursors == sorted(set(cursors))
    stored = await database_sync_to_async(
        lambda: wait_for(lambda: stored_cursors(conversation.id) == cursors, what="the store")
    )()
    assert stored


async def test_events_a_killed_worker_sent_but_never_stored_are_resumed_and_reconciled(worker_node):
    node = worker_node.use(FAKE, PAW_SANDBOX_ISOLATION="none", PAW_TEST_FRESH_WORKER="live-kill")
    conversation = await conversation_with_mode("flood 30 0.002")
    tab = await connect(conversation)
    await tab.send_json_to({"type": "resume", "after": 0})
    with events_table_locked():
        await start(conversation)
        live = await receive_until(tab, is_result)
        node.process.send_signal(signal.SIGKILL)  # between the send and the store
        node.process.wait(timeout=10)
    await tab.disconnect()
    node.stop()
    sent = [m["cursor"] for m in live if m["type"] == "run.event"]
    assert await database_sync_to_async(stored_cursors)(conversation.id) == []

    # A client resuming from anywhere gets them from the live log, exactly once, in order.
    again = await resume_all(conversation)
    assert [m["cursor"] for m in again if m["type"] == "run.event"] == sent
    assert numbers(again) == list(range(1, 31))
    middle = sent[len(sent) // 2]
    rest = await resume_all(conversation, after=middle)
    assert [m["cursor"] for m in rest if m["type"] == "run.event"] == [c for c in sent if c > middle]

    # Too recent for the reaper's round; then stored once, with their cursors and texts.
    assert await database_sync_to_async(events_reconcile)() == 0
    assert await database_sync_to_async(events_reconcile)(older_than=0) == len(sent)
    assert await database_sync_to_async(events_reconcile)(older_than=0) == 0
    assert await database_sync_to_async(stored_cursors)(conversation.id) == sent
    texts = await database_sync_to_async(
        lambda: "".join(
            e.payload.get("text", "")
            for e in RunEvent.objects.filter(conversation=conversation, type="delta").order_by("cursor")
        )
    )()
    assert [int(n) for n in texts.split()] == list(range(1, 31))
    # With the live log gone (Redis restarted), the database alone serves the same.
    await database_sync_to_async(live_log.forget)(conversation.id)
    assert [m["cursor"] for m in (await resume_all(conversation)) if m["type"] == "run.event"] == sent


def test_a_lost_live_log_continues_above_every_cursor_handed_out():
    conversation = ConversationFactory()
    stored = events_append(conversation_id=conversation.id, drafts=[draft("a"), draft("b")])
    assert [e.cursor for e in stored] == [1, 2]
    # Two events sent, not stored yet, when Redis loses the live log (a restart).
    in_flight = events_relay(conversation_id=conversation.id, drafts=[draft("c"), draft("d")])
    assert [e.cursor for e in in_flight] == [3, 4]
    live_log.client().delete(live_log.counter_key(conversation.id), live_log.stream_key(conversation.id))

    (after,) = events_append(conversation_id=conversation.id, drafts=[draft("e")])
    assert after.cursor == 2 + live_log.RESEED_GAP + 1  # above anything handed out
    assert events_store(events={conversation.id: in_flight}) == set()  # no collision
    assert stored_cursors(conversation.id) == [1, 2, 3, 4, after.cursor]
    assert conversation_cursor(conversation_id=conversation.id) == after.cursor
    assert Conversation.objects.get(id=conversation.id).event_cursor == after.cursor


def test_an_event_stored_already_is_left_as_it_is_and_the_others_are_stored():
    """The reaper may store a slow writer's events first: the writer's copy then fails on
    their cursors, and it stores the rest row by row instead of losing its whole batch."""
    conversation = ConversationFactory()
    events = events_relay(conversation_id=conversation.id, drafts=[draft("a"), draft("b")])
    assert events_store(events={conversation.id: events[:1]}) == set()  # the reaper, first
    with transaction.atomic():
        assert events_store(events={conversation.id: events}) == set()  # then the writer
        Conversation.objects.filter(id=conversation.id).update(title="the writer's effects")
    assert stored_cursors(conversation.id) == [1, 2]
    assert Conversation.objects.get(id=conversation.id).title == "the writer's effects"


def test_a_new_conversations_first_event_is_cursor_1_and_its_live_log_goes_with_it(api, user):
    conversation = ConversationFactory(user=user)
    (event,) = events_append(conversation_id=conversation.id, drafts=[draft("hello")])
    assert event.cursor == 1
    assert live_log.last_cursor(conversation.id) == 1
    assert api.delete(f"/api/conversations/{conversation.id}").status_code == 204
    assert live_log.last_cursor(conversation.id) is None
    assert live_log.read(conversation.id, after=0) == (None, [])


def test_the_reconciler_drops_the_live_log_of_a_deleted_conversation():
    conversation = ConversationFactory()
    events_relay(conversation_id=conversation.id, drafts=[draft("orphan")])
    Conversation.objects.filter(id=conversation.id).delete()
    assert events_reconcile(older_than=0) == 0
    assert live_log.read(conversation.id, after=0) == (None, [])


def resynced() -> float:
    return REGISTRY.get_sample_value("paw_relay_events_replayed_total", {"reason": "resync"}) or 0


def hub_connections(server: redis.Redis) -> list[dict]:
    return [c for c in server.client_list(_type="pubsub") if c["name"] == live_log.HUB_CLIENT_NAME]


async def test_a_broken_subscription_is_resumed_and_nothing_is_lost_or_doubled(fake_worker):
    conversation = await conversation_with_mode("flood 300 0.01")
    tab = await connect(conversation)
    await tab.send_json_to({"type": "resume", "after": 0})
    await start(conversation)
    seen = await receive_until(tab, lambda m: m["type"] == "run.event" and m["event"]["type"] == "delta")
    before = resynced()
    # Redis drops the hubs' connections (as on a restart): this process's among them.
    server = redis.Redis.from_url(settings.REDIS_URL)
    killed = hub_connections(server)
    assert killed
    for client in killed:
        server.client_kill_filter(_id=client["id"])
    seen += await receive_until(tab, is_result, timeout=30)
    # The hub connected again by itself, and the socket read back what the break lost.
    assert {c["id"] for c in hub_connections(server)} - {c["id"] for c in killed}
    assert resynced() > before
    await tab.disconnect()
    assert numbers(seen) == list(range(1, 301))
    cursors = [m["cursor"] for m in seen if m["type"] == "run.event"]
    assert cursors == sorted(set(cursors))


async def test_a_client_too_far_behind_is_read_back_to_without_a_gap(monkeypatch):
    """A connection holding too many live appends drops them and reads the log back
    (here it holds none, so every append is read back)."""
    from conversations import consumers

    monkeypatch.setattr(consumers, "LIVE_QUEUE_MAX", 0)
    conversation = await database_sync_to_async(ConversationFactory)()
    tab = await connect(conversation)
    await tab.send_json_to({"type": "resume", "after": 0})
    await asyncio.sleep(0.2)

    def burst() -> None:
        for n in range(40):
            events_append(conversation_id=conversation.id, drafts=[draft(str(n))])

    await database_sync_to_async(burst)()
    got = []
    while len(got) < 40:
        message = await tab.receive_json_from(timeout=10)
        if message["type"] == "run.event":
            got.append(message)
    await tab.disconnect()
    assert [m["event"]["message"] for m in got] == [str(n) for n in range(40)]
    assert [m["cursor"] for m in got] == list(range(1, 41))


async def test_the_live_log_is_what_clients_are_sent(fake_worker):
    """Each append is one Pub/Sub message; a consumer forwards its texts unchanged."""
    conversation = await conversation_with_mode("flood 5 0")
    received: list[tuple[int, list[str]]] = []

    class Listener:
        def live_batch(self, first: int, sent_ms: int, texts: list[str]) -> None:
            received.append((first, texts))

        def live_resync(self) -> None:  # pragma: no cover - the connection stays up
            raise AssertionError("resync")

    listener = Listener()
    await live_log.hub().follow(conversation.id, listener)
    tab = await connect(conversation, path=f"/ws/conversations/{conversation.id}/?frames=batch")
    await tab.send_json_to({"type": "resume", "after": 0})
    await start(conversation)
    frames = []
    while not any(e["event"]["type"] == "result" for f in frames for e in f.get("events", [])):
        frames.append(await tab.receive_json_from(timeout=20))
    await tab.disconnect()
    await live_log.hub().leave(conversation.id, listener)
    sent = [e for f in frames if f["type"] == "run.events" for e in f["events"]]
    published = [json.loads(text) for _, texts in received for text in texts]
    assert sent == published
    assert all(UUID(e["run_id"]) for e in sent)


def relay_many(conversation_id, count: int, text: str = "") -> list:
    """``count`` events put in the live log (and sent), none stored: a writer far behind."""
    events = []
    for first in range(0, count, 500):
        drafts = [draft(f"{n}{text}") for n in range(first, min(count, first + 500))]
        events += events_relay(conversation_id=conversation_id, drafts=drafts)
    return events


def test_events_not_stored_yet_stay_readable_however_many_wait(api, user):
    """The stream never drops an event before it is stored: a writer thousands of events
    behind (a row locked, the database away) leaves every one of them readable."""
    conversation = ConversationFactory(user=user)
    relay_many(conversation.id, 6000)
    cursors, after, more = [], 0, True
    while more:
        page = api.get(f"/api/conversations/{conversation.id}/events?after={after}&limit=1000").json()
        cursors += [e["cursor"] for e in page["events"]]
        after, more = page["next_after"], page["has_more"]
    assert cursors == list(range(1, 6001))
    assert live_log.read(conversation.id, after=0, limit=1)[0] == 1


def test_the_reaper_drops_from_the_stream_only_what_it_checked_is_stored(api, user):
    conversation = ConversationFactory(user=user)
    events = relay_many(conversation.id, 10)
    events_store(events={conversation.id: events[:6]})  # the writer got this far
    assert events_reconcile(older_than=3600) == 0  # nothing old enough: nothing touched
    assert live_log.read(conversation.id, after=0)[0] == 1
    assert events_reconcile(older_than=0) == 4  # stores the 4 the writer did not
    assert live_log.read(conversation.id, after=0) == (None, [])  # checked, then dropped
    page = api.get(f"/api/conversations/{conversation.id}/events?limit=100").json()
    assert [e["cursor"] for e in page["events"]] == list(range(1, 11))


async def test_a_tab_resuming_after_redis_lost_the_counter_is_not_sent_its_events_again():
    """Events sent live, then Redis lost the live log while they were on their way to the
    database: a tab resuming from its last cursor gets only what comes after."""
    conversation = await database_sync_to_async(ConversationFactory)()
    await database_sync_to_async(events_append)(conversation_id=conversation.id, drafts=[draft("stored")])
    in_flight = await database_sync_to_async(relay_many)(conversation.id, 5)  # cursors 2..6
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete(live_log.counter_key(conversation.id), live_log.stream_key(conversation.id))
    tab = await connect(conversation)
    await tab.send_json_to({"type": "resume", "after": 6})
    await database_sync_to_async(events_store)(events={conversation.id: in_flight})
    (new,) = await database_sync_to_async(events_append)(
        conversation_id=conversation.id, drafts=[draft("after the restart")]
    )
    got = []
    while not got or got[-1]["cursor"] != new.cursor:
        message = await tab.receive_json_from(timeout=10)
        if message["type"] == "run.event":
            got.append(message)
    await tab.disconnect()
    assert [m["event"]["message"] for m in got] == ["after the restart"]


async def test_events_appended_in_a_transaction_go_out_when_it_commits():
    conversation = await database_sync_to_async(ConversationFactory)()
    heard: list[list[str]] = []

    class Listener:
        def live_batch(self, first: int, sent_ms: int, texts: list[str]) -> None:
            heard.append(texts)

        def live_resync(self) -> None:  # pragma: no cover - the connection stays up
            raise AssertionError("resync")

    listener = Listener()
    await live_log.hub().follow(conversation.id, listener)
    committed = asyncio.Event()

    def inside_a_transaction(loop) -> None:
        with transaction.atomic():
            events_append(conversation_id=conversation.id, drafts=[draft("with its effects")])
            time.sleep(0.5)
            assert not heard  # not sent before the transaction commits
        loop.call_soon_threadsafe(committed.set)

    await database_sync_to_async(inside_a_transaction)(asyncio.get_running_loop())
    await committed.wait()
    for _ in range(100):
        if heard:
            break
        await asyncio.sleep(0.05)
    await live_log.hub().leave(conversation.id, listener)
    assert [json.loads(t)["event"]["message"] for texts in heard for t in texts] == ["with its effects"]


async def test_a_connection_that_ends_in_an_error_lets_go_of_its_subscription():
    """Channels calls ``disconnect`` only on a disconnect message: a connection that ends
    with an error (its channel layer failing as Redis restarts, a handler raising) must
    still leave the process's live-log subscription (it held its memory for good)."""
    from channels.layers import get_channel_layer

    conversation = await database_sync_to_async(ConversationFactory)()
    tab = await connect(conversation)
    await tab.send_json_to({"type": "resume", "after": 0})
    await asyncio.sleep(0.2)
    hub = live_log.hub()
    channel = live_log.channel_name(conversation.id)
    assert hub._followers.get(channel)
    # A message no handler takes: the connection ends with an error, not a disconnect.
    await get_channel_layer().group_send(f"conversation.{conversation.id}", {"type": "no.such"})
    with pytest.raises(ValueError, match="No handler"):
        await tab.receive_output(timeout=5)
    assert not hub._followers.get(channel)


async def test_a_read_back_of_large_events_comes_in_frames_of_about_a_mebibyte(api, user):
    conversation = await database_sync_to_async(ConversationFactory)(user=user)
    await database_sync_to_async(relay_many)(conversation.id, 6, "x" * 400_000)
    tab = await connect(conversation, path=f"/ws/conversations/{conversation.id}/?frames=batch")
    await tab.send_json_to({"type": "resume", "after": 0})
    frames = []
    while sum(len(f["events"]) for f in frames) < 6:
        frame = await tab.receive_json_from(timeout=10)
        if frame["type"] == "run.events":
            frames.append(frame)
    await tab.disconnect()
    assert [e["cursor"] for f in frames for e in f["events"]] == list(range(1, 7))
    assert len(frames) == 3 and all(len(f["events"]) == 2 for f in frames)  # 2 × 400 kB a page
    page = await database_sync_to_async(api.get)(f"/api/conversations/{conversation.id}/events?limit=100")
    body = page.json()
    assert [e["cursor"] for e in body["events"]] == [1, 2] and body["has_more"] is True
