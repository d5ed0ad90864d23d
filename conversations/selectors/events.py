"""Reads of a conversation's stored run events, in cursor order."""

from __future__ import annotations

from uuid import UUID

from accounts.models import User
from conversations.models import RunEvent
from conversations.selectors.conversations import conversation_get

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
