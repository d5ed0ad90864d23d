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

#: One event as a websocket sends it: ``(cursor, its client form as JSON text)``.
EventText = tuple[int, str]


def _stored(conversation_id: UUID, after: int, until: int | None, limit: int):
    events = RunEvent.objects.filter(conversation_id=conversation_id, cursor__gt=after)
    if until is not None:
        events = events.filter(cursor__lt=until)
    return events.order_by("cursor")[:limit]


def _live(
    conversation_id: UUID, after: int, until: int | None, limit: int
) -> tuple[int | None, list[live_log.LiveEntry]]:
    """``(oldest cursor the stream holds, its entries in the range)``, or ``(None, [])``
    in the embedded mode, or when Redis cannot be reached (logged: readers then get what
    PostgreSQL has)."""
    if not live_log.enabled():
        return None, []
    try:
        return live_log.read(conversation_id, after=after, until=until, limit=limit)
    except redis.RedisError as exc:
        logger.warning("live log unreadable (%s); reading stored events only", exc)
        return None, []


def _stored_texts(conversation_id: UUID, after: int, until: int | None, limit: int) -> list[EventText]:
    return [
        (event.cursor, json.dumps(event_message(event), ensure_ascii=False))
        for event in _stored(conversation_id, after, until, limit)
    ]


def _below(oldest: int | None, until: int | None) -> int | None:
    """Where reading from the database stops: below the stream's oldest event (and
    ``until``)."""
    if oldest is None:
        return until
    return oldest if until is None else min(oldest, until)


def event_texts_after(
    *, conversation_id: UUID, after: int, until: int | None = None, limit: int = EVENTS_LIMIT_MAX
) -> list[EventText]:
    """Up to ``limit`` events of the conversation with ``after < cursor`` (and
    ``cursor < until`` when given), in cursor order, each as ``(cursor, JSON text of its
    client form {"cursor", "run_id", "event"})``. Not scoped to a user: the caller (the
    websocket, after its access check) names the conversation."""
    oldest, entries = _live(conversation_id, after, until, limit)
    texts: list[EventText] = []
    if oldest is None or oldest > after + 1:
        texts = _stored_texts(conversation_id, after, _below(oldest, until), limit)
    texts += [(entry.cursor, entry.text) for entry in entries[: limit - len(texts)]]
    return texts


async def event_texts_after_async(
    *, conversation_id: UUID, after: int, until: int | None = None, limit: int = EVENTS_LIMIT_MAX
) -> list[EventText]:
    """:func:`event_texts_after` from an event loop: the live log is read without leaving
    the loop, the database (only when the stream does not reach back far enough) on the
    caller's database thread."""
    oldest: int | None = None
    entries: list[live_log.LiveEntry] = []
    if live_log.enabled():
        try:
            oldest, entries = await live_log.aread(
                conversation_id, after=after, until=until, limit=limit
            )
        except redis.RedisError as exc:
            logger.warning("live log unreadable (%s); reading stored events only", exc)
    texts: list[EventText] = []
    if oldest is None or oldest > after + 1:
        texts = await database_sync_to_async(_stored_texts)(
            conversation_id, after, _below(oldest, until), limit
        )
    texts += [(entry.cursor, entry.text) for entry in entries[: limit - len(texts)]]
    return texts


def event_list(
    *, user: User, conversation_id: UUID | str, after: int = 0, limit: int = EVENTS_LIMIT_DEFAULT
) -> list[RunEvent]:
    """Up to ``limit`` events of the conversation with ``cursor > after``, by cursor
    (events still only in the live log come as unsaved :class:`RunEvent` objects).

    A client that polls with ``after`` = the last cursor it saw never misses an event:
    every event below the newest one returned is readable already (module docstring).
    Raises ``NotFound`` (404) for a conversation that is not the user's.
    """
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    oldest, entries = _live(conversation.id, after, None, limit)
    events: list[RunEvent] = []
    if oldest is None or oldest > after + 1:
        events = list(_stored(conversation.id, after, oldest, limit))
    events += [_unsaved(conversation, entry) for entry in entries[: limit - len(events)]]
    return events


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


async def conversation_cursor_async(*, conversation_id: UUID) -> int:
    """:func:`conversation_cursor` from an event loop (the live log's counter is read
    without leaving the loop; the database only when it is gone)."""
    if live_log.enabled():
        try:
            handed_out = await live_log.alast_cursor(conversation_id)
        except redis.RedisError as exc:
            logger.warning("live log unreadable (%s); using the stored cursor", exc)
            handed_out = None
        if handed_out is not None:
            return handed_out
    return await database_sync_to_async(_stored_cursor)(conversation_id)


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
