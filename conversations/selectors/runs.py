"""Reads of runs and approvals, always scoped to the requesting user."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db.models import QuerySet

from conversations.models import Approval, Run
from conversations.selectors.conversations import conversation_get
from paw_project.errors import NotFound


def run_list(*, user: Any, conversation_id: UUID | str) -> QuerySet[Run]:
    """The conversation's runs, newest first. Raises ``NotFound`` for another user's one."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    return Run.objects.filter(conversation=conversation).order_by("-created_at", "-id")


def run_get(*, user: Any, conversation_id: UUID | str, run_id: UUID | str) -> Run:
    """One run of the user's conversation, or ``NotFound``."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    run = Run.objects.filter(conversation=conversation, id=run_id).first()
    if run is None:
        raise NotFound("No such run.")
    return run


def approval_list(
    *, user: Any, conversation_id: UUID | str, status: str | None = None
) -> QuerySet[Approval]:
    """The conversation's approvals (optionally only those with ``status``), oldest first.
    Raises ``NotFound`` for another user's conversation."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    approvals = Approval.objects.filter(conversation=conversation).order_by("created_at", "id")
    return approvals.filter(status=status) if status else approvals
