"""The event log of a conversation: cursors, storage and live fan-out.

Two ways, one guarantee (a client that follows the conversation first and then reads
the events after its last cursor misses nothing and gets nothing twice):

* **Redis mode** (``PAW_REDIS_URL``; docs/api.md, "The live path"): cursors come from the
  conversation's live log (:mod:`paw_project.live_log`), which hands them out, keeps the
  events in a Redis stream and publishes them to the websockets in one atomic step, the
  moment a line has its cursor; PostgreSQL gets each event with its cursor right after,
  as the durable copy (:func:`events_relay` then :func:`events_store`, what the node's
  pipeline does; :func:`events_append` does both for everyone else). Readers merge the
  two (``selectors.events``): the stream for the newest events, PostgreSQL for older
  ones. Events that reached the stream but not PostgreSQL (a writer killed in between)
  are stored by :func:`events_reconcile` a minute later.
* **Embedded mode**: every event is stored before it is sent, under a cursor taken from
  the conversation's counter while its row is locked, so cursors increase in commit
  order; the stored events go to the channel-layer group ``conversation.<id>`` after
  commit: ``{"type": "conversation.events", "events": [{"cursor", "run_id", "event"},
  ...], "sent_at": <epoch seconds>}``.

Other live messages go to the group in both modes: ``{"type": "conversation.message",
"message": {...}}`` (``run.status``, ``agent_confirm_request``, ``agent_confirm_resolved``,
``error``).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.db import IntegrityError, connection, transaction
from django.db.models import F
from django.db.models.functions import Greatest
from django.utils import timezone

from conversations.models import Conversation, Run, RunEvent
from conversations.selectors.messages import event_message, run_status_message
from conversations.services.live_status import conversation_changed_publish
from paw_project import broadcast, live_log, metrics

logger = logging.getLogger(__name__)

#: Seconds an event may sit in the live log before :func:`events_reconcile` stores it
#: itself (its writer stores it within milliseconds, or keeps retrying through an outage:
#: then the first of the two wins, and the other leaves it as it is).
RECONCILE_AFTER_SECONDS = 60
#: Events the reaper checks per query.
RECONCILE_PAGE = 1000


class ConversationGone(Conversation.DoesNotExist):
    """The conversation events were stored for no longer exists (deleted mid-run)."""


@dataclass(frozen=True)
class EventDraft:
    """An event to store: the run it belongs to (or ``None``), the line ``type``, the
    notify ``kind`` and the ``payload`` sent to clients (already masked)."""

    run_id: UUID | None
    type: str
    payload: dict[str, Any]
    kind: str = ""


def _cursor_block(conversation_id: UUID, count: int) -> int:
    """Reserve ``count`` cursors; returns the last one. Locks the conversation row until
    the surrounding transaction ends (that is what orders cursors by commit)."""
    table = connection.ops.quote_name(Conversation._meta.db_table)
    pk = Conversation._meta.pk.get_db_prep_value(conversation_id, connection)
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET event_cursor = event_cursor + %s, last_activity_at = %s "  # noqa: S608
            "WHERE id = %s RETURNING event_cursor",
            [count, timezone.now(), pk],
        )
        row = cursor.fetchone()
    if row is None:
        raise ConversationGone(f"conversation {conversation_id} does not exist")
    return row[0]


@dataclass(frozen=True, slots=True)
class StoredEvent:
    """An event with its cursor: what :func:`events_append` and :func:`events_relay`
    return (lighter than a model instance; the attributes :func:`event_message` reads are
    the same). ``created_at``: when it got its cursor (``None``: when it is stored)."""

    cursor: int
    run_id: UUID | None
    type: str
    kind: str
    payload: dict[str, Any]
    created_at: datetime | None = None


_COPY_COLUMNS = ("conversation_id", "run_id", "cursor", "type", "kind", "payload", "created_at")


def _body(draft: EventDraft) -> str:
    """The client form of ``draft`` as compact JSON without its ``{`` (the live log puts
    ``{"cursor": N,`` in front)."""
    run_id = str(draft.run_id) if draft.run_id else None
    text = json.dumps(
        {"run_id": run_id, "event": draft.payload}, ensure_ascii=False, separators=(",", ":")
    )
    return text[1:]


def events_relay(
    *, conversation_id: UUID, drafts: Sequence[EventDraft], publish: bool = True
) -> list[StoredEvent]:
    """Redis mode: give ``drafts`` their cursors and send them to the conversation's
    websockets now, through its live log; store them with :func:`events_store` next.
    With ``publish=False`` they are only put in the live log (a reader reading back gets
    them) and :func:`events_publish` sends them later: what a run's ``result`` does, so
    that a client that gets it finds the run finished.

    Returns the events with their cursors, in order. Raises ``redis.RedisError`` when
    Redis cannot be reached (nothing was sent then). Must not be called in the embedded
    mode (``live_log.enabled()`` is false there)."""
    return events_relay_many(appends=[(conversation_id, drafts, publish)])[0]


def events_relay_many(
    *, appends: Sequence[tuple[UUID, Sequence[EventDraft], bool]]
) -> list[list[StoredEvent]]:
    """:func:`events_relay` for several ``(conversation_id, drafts, publish)`` at once, in
    one round trip to Redis (appends to one conversation keep their order). Returns each
    append's events (``[]`` for no drafts). Raises ``redis.RedisError``."""
    trimmed = [
        (cid, [EventDraft(d.run_id, d.type[:32], d.payload, d.kind[:64]) for d in drafts], publish)
        for cid, drafts, publish in appends
    ]
    firsts = live_log.append_many(
        [
            live_log.Append(
                log_id=cid,
                bodies=[_body(draft) for draft in drafts],
                kinds=[draft.kind for draft in drafts],
                publish=publish,
            )
            for cid, drafts, publish in trimmed
            if drafts
        ],
        seed=_seed,
    )
    now = timezone.now()
    out: list[list[StoredEvent]] = []
    taken = iter(firsts)
    for _, drafts, _ in trimmed:
        if not drafts:
            out.append([])
            continue
        first = next(taken)
        metrics.live_appended(events=len(drafts))
        out.append(
            [
                StoredEvent(first + index, d.run_id, d.type, d.kind, d.payload, now)
                for index, d in enumerate(drafts)
            ]
        )
    return out


def events_publish(*, conversation_id: UUID, events: Sequence[StoredEvent]) -> None:
    """Send events put in the live log with ``events_relay(publish=False)`` (consecutive
    cursors, in order) to the conversation's websockets. A failure is logged: the events
    are in the live log, and a socket reads them back (at the latest when it is quiet)."""
    if not events:
        return
    bodies = [
        _body(EventDraft(event.run_id, event.type, event.payload, event.kind)) for event in events
    ]
    _safe(live_log.publish, log_id=conversation_id, first=events[0].cursor, bodies=bodies)


def _seed(conversation_id: UUID) -> int:
    """Where a live log's new counter starts: 0 for a conversation without stored events
    (its first event is cursor 1), else :data:`~paw_project.live_log.RESEED_GAP` above its
    stored cursor (events handed out before a Redis restart may still be on their way to
    the database: their cursors are never handed out again)."""
    try:
        stored = (
            Conversation.objects.filter(id=conversation_id)
            .values_list("event_cursor", flat=True)
            .first()
            or 0
        )
    finally:
        if not connection.in_atomic_block:
            # A sandbox's reader thread seeds, and otherwise never uses the database: give
            # the pooled connection back (a thread keeps its own until it closes it).
            connection.close()
    return stored + live_log.RESEED_GAP if stored else 0


def events_store(*, events: dict[UUID, Sequence[StoredEvent]]) -> set[UUID]:
    """Store events that already have their cursors (:func:`events_relay`), by
    conversation, in the caller's transaction (or its own): each conversation's
    ``event_cursor`` becomes at least its last cursor and its ``last_activity_at`` now.

    Returns the conversations that no longer exist; their events are not stored. An event
    already stored (the reconciler was first) is left as it is. Raises ``DatabaseError``.
    """
    events = {cid: batch for cid, batch in events.items() if batch}
    if not events:
        return set()
    now = timezone.now()
    with transaction.atomic():
        present = _cursors_raised(
            {cid: max(e.cursor for e in batch) for cid, batch in events.items()}, now
        )
        rows = [(cid, event) for cid in sorted(present) for event in events[cid]]
        if rows:
            _insert(rows, now)
    return set(events) - present


#: A conversation's ``last_activity_at`` moves with its events at most this often: its
#: row is updated with every stored batch, and an unchanged indexed column lets
#: PostgreSQL update it in place (a HOT update: no new index entries, less to vacuum).
ACTIVITY_RESOLUTION = timedelta(seconds=1)


def _cursors_raised(last: dict[UUID, int], now: datetime) -> set[UUID]:
    """Raise each conversation's ``event_cursor`` to at least ``last[id]`` (and its
    ``last_activity_at`` to ``now`` when it is older than :data:`ACTIVITY_RESOLUTION`);
    returns the ids that exist. One statement on PostgreSQL."""
    stale = now - ACTIVITY_RESOLUTION
    if connection.vendor != "postgresql":
        present = set()
        for cid in sorted(last):
            rows = Conversation.objects.filter(id=cid)
            if rows.update(event_cursor=Greatest(F("event_cursor"), last[cid])):
                present.add(cid)
                rows.filter(last_activity_at__lt=stale).update(last_activity_at=now)
        return present
    table = connection.ops.quote_name(Conversation._meta.db_table)
    values = ", ".join(["(%s::uuid, %s::bigint)"] * len(last))
    params: list[Any] = [stale, now]
    for cid in sorted(last):
        params += [cid, last[cid]]
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} AS c SET event_cursor = GREATEST(c.event_cursor, v.last), "  # noqa: S608
            "last_activity_at = CASE WHEN c.last_activity_at < %s THEN %s "
            "ELSE c.last_activity_at END "
            f"FROM (VALUES {values}) AS v(id, last) WHERE c.id = v.id RETURNING c.id",
            params,
        )
        return {row[0] for row in cursor.fetchall()}


def _insert(rows: list[tuple[UUID, StoredEvent]], now: datetime) -> None:
    """Insert events with their cursors: one ``COPY`` on PostgreSQL (the pipeline's hot
    path). Should that fail on a constraint (an event stored already by the reconciler,
    or one whose run is gone), row by row, skipping the rows that fail (logged)."""
    if connection.vendor == "postgresql":
        try:
            with transaction.atomic():
                _copy(rows, now)
            return
        except IntegrityError:
            logger.info("an event could not be copied; storing them one by one")
    for cid, event in rows:
        try:
            with transaction.atomic():
                _model(cid, event, now).save(force_insert=True)
        except IntegrityError as exc:
            logger.warning("event %s of conversation %s not stored: %s", event.cursor, cid, exc)


def _model(conversation_id: UUID, event: StoredEvent, now: datetime) -> RunEvent:
    return RunEvent(
        conversation_id=conversation_id,
        run_id=event.run_id,
        cursor=event.cursor,
        type=event.type,
        kind=event.kind,
        payload=event.payload,
        created_at=event.created_at or now,
    )


def _copy(rows: Iterable[tuple[UUID, StoredEvent]], now: datetime) -> None:
    """One ``COPY`` of ``rows``. psycopg's errors come out as Django's (an
    ``IntegrityError`` for a cursor stored already), as from any other statement: the
    copy is made on the driver's own cursor, under Django's error wrapper."""
    table = connection.ops.quote_name(RunEvent._meta.db_table)
    with (
        connection.wrap_database_errors,
        connection.cursor() as cursor,
        cursor.cursor.copy(f"COPY {table} ({', '.join(_COPY_COLUMNS)}) FROM STDIN") as copy,
    ):
        for cid, event in rows:
            copy.write_row(
                (cid, event.run_id, event.cursor, event.type, event.kind,
                 json.dumps(event.payload, ensure_ascii=False), event.created_at or now)
            )  # fmt: skip


def events_append(*, conversation_id: UUID, drafts: Sequence[EventDraft]) -> list[StoredEvent]:
    """Store ``drafts`` as events of the conversation, in order, with new cursors, and
    send them to the conversation's websockets.

    Redis mode: put in the live log at once and stored in the caller's transaction (or
    its own); sent to the websockets once that commits (at once outside a transaction).
    Should it roll back, the reaper stores them later (they may have been read back).
    Embedded mode: stored, and sent (one channel-layer message for the lot) once the
    transaction commits; on PostgreSQL the rows go in with one ``COPY``, on SQLite
    through the ORM.

    Returns the events. Raises :class:`ConversationGone` if the conversation is gone.
    """
    if not drafts:
        return []
    if live_log.enabled():
        if not Conversation.objects.filter(id=conversation_id).exists():
            raise ConversationGone(f"conversation {conversation_id} does not exist")
        # Inside a transaction the events go out once it commits, with what it did (a
        # policy violation with the run's end): a socket would otherwise read back a
        # run's held result through the gap they make (docs/api.md, "The live path").
        in_transaction = connection.in_atomic_block
        events = events_relay(
            conversation_id=conversation_id, drafts=drafts, publish=not in_transaction
        )
        if events_store(events={conversation_id: events}):
            raise ConversationGone(f"conversation {conversation_id} does not exist")
        if in_transaction:
            transaction.on_commit(
                lambda: events_publish(conversation_id=conversation_id, events=events)
            )
        return events
    with transaction.atomic():
        last = _cursor_block(conversation_id, len(drafts))
        first = last - len(drafts) + 1
        now = timezone.now()
        events = [
            StoredEvent(
                first + index, draft.run_id, draft.type[:32], draft.kind[:64], draft.payload, now
            )
            for index, draft in enumerate(drafts)
        ]
        if connection.vendor == "postgresql":
            _copy(((conversation_id, event) for event in events), now)
        else:
            RunEvent.objects.bulk_create(_model(conversation_id, e, now) for e in events)
        transaction.on_commit(
            lambda: _safe(_events_publish, conversation_id=conversation_id, events=events)
        )
    return events


def events_reconcile(*, older_than: float = RECONCILE_AFTER_SECONDS) -> int:
    """Redis mode: store every event that has been in a live log for ``older_than``
    seconds without reaching PostgreSQL (its writer was killed between the two, or its
    transaction rolled back after the event was shown), then drop from the live logs
    what is checked stored: a stream holds only its last minute and what is not stored
    yet, and each event is looked at once. The live logs of deleted conversations are
    removed. Returns the number of events stored. Idempotent; run by the beat
    (``sandboxes.tasks.nodes_reap``, every 15 s)."""
    if not live_log.enabled():
        return 0
    before_ms = int((time.time() - older_than) * 1000)
    stored = 0
    for log_id in live_log.streams():
        try:
            conversation_id = uuid.UUID(log_id)
        except ValueError:
            continue
        while True:
            entries = live_log.entries_older_than(
                log_id, appended_before_ms=before_ms, limit=RECONCILE_PAGE
            )
            if not entries:
                break
            known = set(
                RunEvent.objects.filter(
                    conversation_id=conversation_id,
                    cursor__gte=entries[0].cursor,
                    cursor__lte=entries[-1].cursor,
                ).values_list("cursor", flat=True)
            )
            missing = [_from_live(entry) for entry in entries if entry.cursor not in known]
            if missing:
                with transaction.atomic():
                    gone = events_store(events={conversation_id: missing})
                if gone:
                    live_log.forget(conversation_id)
                    break
                logger.warning(
                    "live log: stored %d event(s) of conversation %s that their writer had not",
                    len(missing),
                    conversation_id,
                )
                stored += len(missing)
            live_log.trim_stored(log_id, through=entries[-1].cursor)
            if len(entries) < RECONCILE_PAGE:
                break
    return stored


def _from_live(entry: live_log.LiveEntry) -> StoredEvent:
    message = json.loads(entry.text)
    payload = message.get("event") or {}
    run_id = message.get("run_id")
    return StoredEvent(
        cursor=entry.cursor,
        run_id=UUID(run_id) if run_id else None,
        type=str(payload.get("type", ""))[:32],
        kind=entry.kind[:64],
        payload=payload,
        created_at=datetime.fromtimestamp(entry.appended_ms / 1000, tz=UTC),
    )


def _events_publish(*, conversation_id: UUID, events: Sequence[RunEvent | StoredEvent]) -> None:
    """Send stored events to the conversation's live group (after commit)."""
    if events:
        broadcast.group_send(
            broadcast.conversation_group(conversation_id),
            {
                "type": "conversation.events",
                "events": [event_message(e) for e in events],
                "sent_at": time.time(),
            },
        )


def message_publish(*, conversation_id: UUID, message: dict[str, Any]) -> None:
    """Send one message (``{"type": "run.status", ...}`` etc.) to the live group."""
    broadcast.group_send(
        broadcast.conversation_group(conversation_id),
        {"type": "conversation.message", "message": message},
    )


def conversation_deleted_publish(*, conversation_id: UUID) -> None:
    """Tell the conversation's open websockets it is gone (they close with 4404), and
    remove its live log (Redis mode)."""
    _safe(
        broadcast.group_send,
        group=broadcast.conversation_group(conversation_id),
        message={"type": "conversation.deleted"},
    )
    if live_log.enabled():
        _safe(live_log.forget, log_id=conversation_id)


def run_status_publish(run: Run) -> None:
    """Publish ``run.status`` for ``run`` once the current transaction commits (and the
    conversation's new state to its owner's sidebar, ``live_status``)."""
    message_publish_on_commit(conversation_id=run.conversation_id, message=run_status_message(run))
    conversation_changed_publish(conversation_id=run.conversation_id)


def message_publish_on_commit(*, conversation_id: UUID, message: dict[str, Any]) -> None:
    """Send ``message`` to the conversation's live group once the current transaction
    commits (at once outside one); a failure is logged, never raised."""
    transaction.on_commit(
        lambda: _safe(message_publish, conversation_id=conversation_id, message=message)
    )


def notice_append(
    *, conversation_id: UUID, run_id: UUID | None, code: str, message: str, level: str = "warning"
) -> StoredEvent:
    """Store and (after commit) publish a PAW notice event, e.g. "the agent restarted".

    Payload: ``{"type": "notice", "level", "code", "message"}``.
    """
    payload = {"type": "notice", "level": level, "code": code, "message": message}
    (event,) = events_append(
        conversation_id=conversation_id,
        drafts=[EventDraft(run_id=run_id, type="notice", kind=code, payload=payload)],
    )
    return event


def _safe(func: Any, **kwargs: Any) -> None:
    """Live fan-out is best effort: the event is stored, a client catches up on resume."""
    try:
        func(**kwargs)
    except Exception:
        logger.exception("live fan-out failed (the stored events remain)")
