"""The event log of a conversation: cursors, storage and live fan-out.

Every event is stored before it is sent, under a cursor taken from the conversation's
counter while its row is locked: cursors therefore increase in commit order, and a client
that joins the live group first and then reads the stored events after its last cursor
misses nothing (the rule the websocket ``resume`` relies on).

Live messages go to the channel-layer group ``conversation.<id>``:

- ``{"type": "conversation.events", "events": [{"cursor", "run_id", "event"}, ...],
  "sent_at": <epoch seconds>}``: stored events, in cursor order (a consumer sends each as
  a ``run.event``; ``sent_at`` measures the relay's send→client lag);
- ``{"type": "conversation.message", "message": {...}}``: a message sent as is
  (``run.status``, ``agent_confirm_request``, ``agent_confirm_resolved``, ``error``).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from django.db import connection, transaction
from django.utils import timezone

from conversations.models import Conversation, Run, RunEvent
from conversations.selectors.messages import event_message, run_status_message
from conversations.services.live_status import conversation_changed_publish
from paw_project import broadcast

logger = logging.getLogger(__name__)


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
    """An event as stored: what :func:`events_append` returns (lighter than a model
    instance; the attributes :func:`event_message` reads are the same)."""

    cursor: int
    run_id: UUID | None
    type: str
    kind: str
    payload: dict[str, Any]


_COPY_COLUMNS = ("conversation_id", "run_id", "cursor", "type", "kind", "payload", "created_at")


def events_append(*, conversation_id: UUID, drafts: Sequence[EventDraft]) -> list[StoredEvent]:
    """Store ``drafts`` as events of the conversation, in order, with new cursors, and
    send them to the conversation's live group once the transaction commits (one
    channel-layer message for the lot).

    Runs inside the caller's transaction (or its own). On PostgreSQL the rows go in with
    one ``COPY`` (the pipeline's hot path: the ORM's per-row cost dominated it); on SQLite
    through the ORM. Returns the stored events. Raises :class:`ConversationGone` if the
    conversation is gone.
    """
    if not drafts:
        return []
    with transaction.atomic():
        last = _cursor_block(conversation_id, len(drafts))
        first = last - len(drafts) + 1
        now = timezone.now()
        events = [
            StoredEvent(
                first + index, draft.run_id, draft.type[:32], draft.kind[:64], draft.payload
            )
            for index, draft in enumerate(drafts)
        ]
        if connection.vendor == "postgresql":
            table = connection.ops.quote_name(RunEvent._meta.db_table)
            with (
                connection.cursor() as cursor,
                cursor.cursor.copy(f"COPY {table} ({', '.join(_COPY_COLUMNS)}) FROM STDIN") as copy,
            ):
                for event in events:
                    copy.write_row(
                        (conversation_id, event.run_id, event.cursor, event.type, event.kind,
                         json.dumps(event.payload, ensure_ascii=False), now)
                    )  # fmt: skip
        else:
            RunEvent.objects.bulk_create(
                RunEvent(
                    conversation_id=conversation_id,
                    run_id=e.run_id,
                    cursor=e.cursor,
                    type=e.type,
                    kind=e.kind,
                    payload=e.payload,
                    created_at=now,
                )
                for e in events
            )
        transaction.on_commit(
            lambda: _safe(_events_publish, conversation_id=conversation_id, events=events)
        )
    return events


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
    """Tell the conversation's open websockets it is gone (they close with 4404)."""
    _safe(
        broadcast.group_send,
        group=broadcast.conversation_group(conversation_id),
        message={"type": "conversation.deleted"},
    )


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
