"""Reads of a conversation's run events, in cursor order.

In Redis mode the newest events are in the conversation's live log
(:mod:`paw_project.live_log`) a few milliseconds before PostgreSQL has them, so reads
merge the two: the live log's stream for every cursor it still holds, PostgreSQL for
older ones (the stream only ever loses its oldest entries, which are stored by then).
In the embedded mode PostgreSQL (or SQLite) alone has them, stored before they are sent.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import redis
from channels.db import database_sync_to_async

from accounts.models import User
from conversations.models import Conversation, RunEvent
from conversations.selectors.conversations import conversation_get
from conversations.selectors.messages import event_message
from paw_project import live_log

logger = logging.getLogger(__name__)

EVENTS_LIMIT_DEFAULT = 100
EVENTS_LIMIT_MAX = 1000
#: Bytes of event texts a read-back takes at most (at least one event): a page of large
#: events (a line may hold 4 MiB) is cut short, the rest read next.
READ_BACK_MAX_BYTES = 1 << 20

#: One event as a websocket sends it: ``(cursor, its client form as JSON text)``.
EventText = tuple[int, str]


def _stored(conversation_id: UUID, after: int, until: int | None, limit: int):
    events = RunEvent.objects.filter(conversation_id=conversation_id, cursor__gt=after)
    if until is not None:
        events = events.filter(cursor__lt=until)
    return events.order_by("cursor")[:limit]


def _live(
    conversation_id: UUID, after: int, until: int | None, limit: int, max_bytes: int | None = None
) -> tuple[int | None, list[live_log.LiveEntry]]:
    """``(oldest cursor the stream holds, its entries in the range)``, or ``(None, [])``
    in the embedded mode, or when Redis cannot be reached (logged: readers then get what
    PostgreSQL has)."""
    if not live_log.enabled():
        return None, []
    try:
        return live_log.read(
            conversation_id, after=after, until=until, limit=limit, max_bytes=max_bytes
        )
    except redis.RedisError as exc:
        logger.warning("live log unreadable (%s); reading stored events only", exc)
        return None, []


def _stored_texts(
    conversation_id: UUID, after: int, until: int | None, limit: int, max_bytes: int
) -> list[EventText]:
    texts: list[EventText] = []
    size = 0
    for event in _stored(conversation_id, after, until, limit).iterator(chunk_size=50):
        text = json.dumps(event_message(event), ensure_ascii=False)
        if texts and size + len(text) > max_bytes:
            break
        texts.append((event.cursor, text))
        size += len(text)
    return texts


def _within(
    texts: list[EventText], entries: list[live_log.LiveEntry], limit: int, max_bytes: int
) -> list[EventText]:
    """``texts`` (from the database) then ``entries`` (the stream's), within ``limit``
    and the byte budget (at least one event)."""
    size = sum(len(text) for _, text in texts)
    for entry in entries:
        if len(texts) >= limit or (texts and size + len(entry.text) > max_bytes):
            break
        texts.append((entry.cursor, entry.text))
        size += len(entry.text)
    return texts


def _below(oldest: int | None, until: int | None) -> int | None:
    """Where reading from the database stops: below the stream's oldest event (and
    ``until``)."""
    if oldest is None:
        return until
    return oldest if until is None else min(oldest, until)


def event_texts_after(
    *,
    conversation_id: UUID,
    after: int,
    until: int | None = None,
    limit: int = EVENTS_LIMIT_MAX,
    max_bytes: int = READ_BACK_MAX_BYTES,
) -> list[EventText]:
    """Up to ``limit`` events of the conversation with ``after < cursor`` (and
    ``cursor < until`` when given), in cursor order, each as ``(cursor, JSON text of its
    client form {"cursor", "run_id", "event"})``, their texts within ``max_bytes`` (at
    least one event; an empty list means there is none). Not scoped to a user: the
    caller (the websocket, after its access check) names the conversation."""
    oldest, entries = _live(conversation_id, after, until, limit, max_bytes)
    texts: list[EventText] = []
    if oldest is None or oldest > after + 1:
        texts = _stored_texts(conversation_id, after, _below(oldest, until), limit, max_bytes)
    return _within(texts, entries, limit, max_bytes)


async def event_texts_after_async(
    *,
    conversation_id: UUID,
    after: int,
    until: int | None = None,
    limit: int = EVENTS_LIMIT_MAX,
    max_bytes: int = READ_BACK_MAX_BYTES,
) -> list[EventText]:
    """:func:`event_texts_after` from an event loop: the live log is read without leaving
    the loop, the database (only when the stream does not reach back far enough) on the
    caller's database thread."""
    oldest: int | None = None
    entries: list[live_log.LiveEntry] = []
    if live_log.enabled():
        try:
            oldest, entries = await live_log.aread(
                conversation_id, after=after, until=until, limit=limit, max_bytes=max_bytes
            )
        except redis.RedisError as exc:
            logger.warning("live log unreadable (%s); reading stored events only", exc)
    texts: list[EventText] = []
    if oldest is None or oldest > after + 1:
        texts = await database_sync_to_async(_stored_texts)(
            conversation_id, after, _below(oldest, until), limit, max_bytes
        )
    return _within(texts, entries, limit, max_bytes)


def event_list(
    *,
    user: User,
    conversation_id: UUID | str,
    after: int = 0,
    limit: int = EVENTS_LIMIT_DEFAULT,
    max_bytes: int = READ_BACK_MAX_BYTES,
) -> tuple[list[RunEvent], bool]:
    """``(events, cut)``: up to ``limit`` events of the conversation with
    ``cursor > after``, by cursor (events still only in the live log come as unsaved
    :class:`RunEvent` objects), their payloads within ``max_bytes`` (at least one event);
    ``cut`` when the byte budget left events out (more follow the last one).

    A client that polls with ``after`` = the last cursor it saw never misses an event:
    every event below the newest one returned is readable already (module docstring).
    Raises ``NotFound`` (404) for a conversation that is not the user's.
    """
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    oldest, entries = _live(conversation.id, after, None, limit, max_bytes)
    candidates: list[tuple[RunEvent, int]] = []
    if oldest is None or oldest > after + 1:
        stored_size = 0  # stop reading once past the budget (the one past it shows the cut)
        for event in _stored(conversation.id, after, oldest, limit).iterator(chunk_size=50):
            size = len(json.dumps(event.payload, ensure_ascii=False))
            candidates.append((event, size))
            stored_size += size
            if stored_size > max_bytes:
                break
    candidates += [(_unsaved(conversation, entry), len(entry.text)) for entry in entries]
    events: list[RunEvent] = []
    size = 0
    for event, event_size in candidates:
        if len(events) >= limit:
            break
        if events and size + event_size > max_bytes:
            return events, True
        events.append(event)
        size += event_size
    return events, False


def _unsaved(conversation: Conversation, entry: live_log.LiveEntry) -> RunEvent:
    message = json.loads(entry.text)
    payload = message.get("event") or {}
    return RunEvent(
        conversation=conversation,
        run_id=message.get("run_id"),
        cursor=entry.cursor,
        type=str(payload.get("type", ""))[:32],
        kind=entry.kind,
        payload=payload,
        created_at=datetime.fromtimestamp(entry.appended_ms / 1000, tz=UTC),
    )


def event_messages_after(
    *, conversation_id: UUID, after: int, until: int | None = None, limit: int = EVENTS_LIMIT_MAX
) -> list[dict[str, Any]]:
    """As :func:`event_texts_after`, each event as a dict ``{"cursor", "run_id", "event"}``."""
    return [
        json.loads(text)
        for _, text in event_texts_after(
            conversation_id=conversation_id, after=after, until=until, limit=limit
        )
    ]


async def _handed_out_async(conversation_id: UUID) -> int | None:
    """The live log's counter, read without leaving the loop; ``None`` when it is gone
    or Redis cannot be reached (logged)."""
    try:
        return await live_log.alast_cursor(conversation_id)
    except redis.RedisError as exc:
        logger.warning("live log unreadable (%s); using the stored cursor", exc)
        return None


async def conversation_cursor_async(*, conversation_id: UUID) -> int:
    """:func:`conversation_cursor` from an event loop (the live log's counter is read
    without leaving the loop; the database only when it is gone)."""
    if live_log.enabled():
        handed_out = await _handed_out_async(conversation_id)
        if handed_out is not None:
            return handed_out
    return await database_sync_to_async(_stored_cursor)(conversation_id)


async def cursor_ceiling_async(*, conversation_id: UUID) -> int:
    """The highest cursor a client can hold: the live log's counter, or, when Redis lost
    it, where its next seed starts (``RESEED_GAP`` above the stored cursor, or 0 when
    nothing is stored): events sent live before the loss and not stored yet lie below
    that, and a client that has them must not be sent them again when they are stored.
    A resume's ``after`` is cut to this (a cursor from the future would hide the events
    still to come)."""
    if not live_log.enabled():
        return await database_sync_to_async(_stored_cursor)(conversation_id)
    handed_out = await _handed_out_async(conversation_id)
    if handed_out is not None:
        return handed_out
    stored = await database_sync_to_async(_stored_cursor)(conversation_id)
    return stored + live_log.RESEED_GAP if stored else 0


def _stored_cursor(conversation_id: UUID) -> int:
    return (
        Conversation.objects.filter(id=conversation_id)
        .values_list("event_cursor", flat=True)
        .first()
        or 0
    )


def conversation_cursor(*, conversation_id: UUID) -> int:
    """The cursor of the conversation's latest event (0 before the first, or when the
    conversation is gone): the live log's counter in Redis mode, else the stored one."""
    if live_log.enabled():
        try:
            handed_out = live_log.last_cursor(conversation_id)
        except redis.RedisError as exc:
            logger.warning("live log unreadable (%s); using the stored cursor", exc)
            handed_out = None
        if handed_out is not None:
            return handed_out
    return _stored_cursor(conversation_id)


def notice_latest_at(*, conversation_id: UUID, code: str) -> datetime | None:
    """When the conversation's newest stored ``notice`` of ``code`` (e.g.
    ``runtime_ungated``) was stored, or ``None`` when it has none."""
    return (
        RunEvent.objects.filter(conversation_id=conversation_id, type="notice", kind=code)
        .order_by("-cursor")
        .values_list("created_at", flat=True)
        .first()
    )
