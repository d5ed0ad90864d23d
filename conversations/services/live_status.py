"""The conversation list's live feed: small per-user messages to ``user.<id>`` (every
websocket of the person) when a conversation's state in the sidebar changes — a run
starts or ends, an approval is raised, decided or expires, a title changes, a
conversation is created or deleted. The per-user socket (``ws/user/``) relays them.

Each message carries the conversation's whole sidebar state read after the change
committed (``conversation.updated``), so messages are idempotent: a lost one is made
good by the next one or by the client's resync from ``GET /api/conversations`` when it
(re)connects. Live fan-out is best effort: a failure is logged, never raised.
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from django.db import transaction

from conversations.selectors.sidebar import conversation_live_state
from paw_project import broadcast

logger = logging.getLogger(__name__)


def conversation_changed_publish(*, conversation_id: UUID | str) -> None:
    """After the current transaction commits (at once outside one), send
    ``{"type": "conversation.updated", "conversation": state}`` to its owner's
    ``user.<id>`` group (``state``: :func:`conversation_live_state`)."""
    transaction.on_commit(lambda: _safe(_changed_send, conversation_id=conversation_id))


def conversation_removed_publish(*, conversation_id: UUID | str, user_id: Any) -> None:
    """After commit, send ``{"type": "conversation.removed", "id"}`` to ``user.<user_id>``."""
    transaction.on_commit(
        lambda: _safe(
            broadcast.group_send,
            group=broadcast.user_group(user_id),
            message={"type": "conversation.removed", "id": str(conversation_id)},
        )
    )


def _changed_send(*, conversation_id: UUID | str) -> None:
    found = conversation_live_state(conversation_id=conversation_id)
    if found is None:
        return
    user_id, state = found
    broadcast.group_send(
        broadcast.user_group(user_id), {"type": "conversation.updated", "conversation": state}
    )


def _safe(func: Any, **kwargs: Any) -> None:
    try:
        func(**kwargs)
    except Exception:
        logger.exception("the conversation list's live message failed (a resync makes it good)")
