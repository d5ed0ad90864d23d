"""Reads of conversations, always scoped to their owner."""

from __future__ import annotations

from uuid import UUID

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import QuerySet, UUIDField
from django.db.models.expressions import RawSQL

from accounts.models import User
from conversations.models import Conversation, Run
from paw_project.errors import NotFound

# The statement of ``Subquery(Run.objects.filter(conversation=OuterRef("pk"),
# status__in=Run.ACTIVE_STATUSES).values("id")[:1])``, written once: Django builds, resolves
# and compiles such a subquery anew on every request, about a third of a millisecond of CPU
# per conversation list (bench/api.py). It names the outer table, so it holds only at the
# top level of a query (Django renames the tables of a nested one). Identifiers are
# double-quoted, which PostgreSQL and SQLite (PAW's two databases) both read.
_ACTIVE_RUN_SQL = (
    'SELECT "run"."id" FROM "conversations_run" "run" '
    'WHERE "run"."conversation_id" = "conversations_conversation"."id" '
    'AND "run"."status" IN (%s, %s, %s) '  # Run.ACTIVE_STATUSES
    'ORDER BY "run"."created_at" ASC LIMIT 1'
)


def conversation_list(*, user: User) -> QuerySet[Conversation]:
    """The user's conversations, newest activity first (ties: newest created, then id, so
    pages are stable), each annotated with ``active_run_pk`` (see
    :func:`conversation_active_run_id`). Use it as the top-level query (it may be
    filtered, ordered and sliced, not nested in another query)."""
    return (
        Conversation.objects.filter(user=user)
        .annotate(
            active_run_pk=RawSQL(  # noqa: S611 - constant SQL, values are parameters
                _ACTIVE_RUN_SQL,
                [str(status) for status in Run.ACTIVE_STATUSES],
                output_field=UUIDField(),
            )
        )
        .order_by("-last_activity_at", "-created_at", "-id")
    )


def conversation_active_run_id(conversation: Conversation) -> UUID | None:
    """The id of the conversation's active run (queued, starting or running), or ``None``.
    Uses the ``active_run_pk`` annotation of :func:`conversation_list` when present, else
    one query."""
    if hasattr(conversation, "active_run_pk"):
        return conversation.active_run_pk
    return (
        Run.objects.filter(conversation=conversation, status__in=Run.ACTIVE_STATUSES)
        .values_list("id", flat=True)
        .first()
    )


def conversation_get(
    *, user: User, conversation_id: UUID | str, for_update: bool = False
) -> Conversation:
    """The user's conversation ``conversation_id`` (``for_update``: row-locked until the
    surrounding transaction ends).

    Raises ``NotFound`` (404) when it does not exist or belongs to someone else (one answer
    for both, so ids of other people's conversations cannot be probed) or the id is not a
    UUID. The lookup every conversation-scoped endpoint, service and the websocket start
    with.
    """
    conversations = Conversation.objects.select_for_update() if for_update else Conversation.objects
    try:
        return conversations.get(pk=conversation_id, user=user)
    except (Conversation.DoesNotExist, ValidationError, ValueError, TypeError) as error:
        raise NotFound("No such conversation.", code="not_found") from error


def conversation_history(*, user: User, conversation_id: UUID | str) -> QuerySet[Run]:
    """The conversation's turns (its runs), oldest first. Raises ``NotFound`` like
    :func:`conversation_get`."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    return Run.objects.filter(conversation=conversation).order_by("created_at", "id")


def approval_timeout_of(conversation: Conversation) -> int:
    """Seconds an approval of ``conversation`` waits for its answer: its own
    ``approval_timeout_seconds``, else the server default ``PAW_APPROVAL_TIMEOUT_SECONDS``."""
    return conversation.approval_timeout_seconds or settings.PAW_APPROVAL_TIMEOUT_SECONDS
