"""Reads of a conversation's stored run events, in cursor order."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from accounts.models import User
from conversations.models import Conversation, RunEvent
from conversations.selectors.conversations import conversation_get
from conversations.selectors.messages import event_message

EVENTS_LIMIT_DEFAULT = 100
EVENTS_LIMIT_MAX = 1000


def event_list(
    *, user: User, conversation_id: UUID | str, after: int = 0, limit: int = EVENTS_LIMIT_DEFAULT
) -> list[RunEvent]:
    """Up to ``limit`` events of the conversation with ``cursor > after``, by cursor.

    Cursors are allocated under the conversation's row lock, so they grow in commit order:
    a client that polls with ``after`` = the last cursor it saw never misses an event.
    Raises ``NotFound`` (404) for a conversation that is not the user's.
    """
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    return list(
        RunEvent.objects.filter(conversation=conversation, cursor__gt=after).order_by("cursor")[
            :limit
        ]
    )


def event_messages_after(
    *, conversation_id: UUID, after: int, until: int | None = None, limit: int = EVENTS_LIMIT_MAX
) -> list[dict[str, Any]]:
    """Up to ``limit`` stored events of the conversation with ``after < cursor`` (and
    ``cursor < until`` when given), in cursor order, in their client form
    (:func:`~conversations.selectors.messages.event_message`). Not scoped to a user: the
    caller (the websocket, after its access check) names the conversation."""
    events = RunEvent.objects.filter(conversation_id=conversation_id, cursor__gt=after)
    if until is not None:
        events = events.filter(cursor__lt=until)
    return [event_message(event) for event in events.order_by("cursor")[:limit]]


def conversation_cursor(*, conversation_id: UUID) -> int:
    """The cursor of the conversation's latest stored event (0 before the first, or when
    the conversation is gone)."""
    return (
        Conversation.objects.filter(id=conversation_id)
        .values_list("event_cursor", flat=True)
        .first()
        or 0
    )
