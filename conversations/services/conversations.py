"""Writes for conversations: create, update, delete, and forgetting the agent's memory."""

from __future__ import annotations

import shutil
from typing import Any
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from accounts.models import User
from conversations.models import Conversation, Run
from conversations.services.events import conversation_deleted_publish
from conversations.workspaces import workspace_ensure, workspace_path
from paw_project.errors import Conflict, NotFound

UPDATABLE_FIELDS = ("title", "auto_approve", "llm_provider", "llm_model")


def _locked(*, user: User, conversation_id: UUID | str) -> Conversation:
    """The user's conversation, row-locked until the transaction ends. Raises ``NotFound``."""
    try:
        return Conversation.objects.select_for_update().get(pk=conversation_id, user=user)
    except (Conversation.DoesNotExist, ValueError) as error:
        raise NotFound("No such conversation.", code="not_found") from error


def conversation_create(
    *,
    user: User,
    title: str = "",
    auto_approve: bool = False,
    llm_provider: str = "",
    llm_model: str = "",
) -> Conversation:
    """A new conversation of ``user``; its workspace folder is created after commit."""
    conversation = Conversation.objects.create(
        user=user,
        title=title,
        auto_approve=auto_approve,
        llm_provider=llm_provider,
        llm_model=llm_model,
    )
    transaction.on_commit(lambda: workspace_ensure(conversation.id))
    return conversation


def conversation_update(*, user: User, conversation_id: UUID | str, **fields: Any) -> Conversation:
    """Change any of ``title``, ``auto_approve``, ``llm_provider``, ``llm_model`` (only the
    ones given). Raises ``NotFound`` (404) for another user's conversation, ``TypeError`` for
    other field names (a programming error)."""
    unknown = set(fields) - set(UPDATABLE_FIELDS)
    if unknown:
        raise TypeError(f"not updatable: {sorted(unknown)}")
    with transaction.atomic():
        conversation = _locked(user=user, conversation_id=conversation_id)
        for name, value in fields.items():
            setattr(conversation, name, value)
        if fields:
            conversation.save(update_fields=[*fields, "updated_at"])
    return conversation


def conversation_delete(*, user: User, conversation_id: UUID | str) -> None:
    """Delete the conversation with its files, runs, events and approvals; after commit,
    its sandbox is stopped (by the node that owns it), its workspace folder removed and
    its open websockets closed (4404).
    Raises ``NotFound`` (404) for another user's conversation."""
    from sandboxes.services import sandbox_stop_for_conversation

    with transaction.atomic():
        conversation = _locked(user=user, conversation_id=conversation_id)
        deleted_id = conversation.id
        # Before the delete: the sandbox rows (which name the owning node) go with it.
        sandbox_stop_for_conversation(conversation_id=deleted_id)
        conversation.delete()
        transaction.on_commit(lambda: shutil.rmtree(workspace_path(deleted_id), ignore_errors=True))
        # Its open tabs are closed (4404), not left waiting on a run that is gone.
        transaction.on_commit(lambda: conversation_deleted_publish(conversation_id=deleted_id))


def conversation_session_reset(*, user: User, conversation_id: UUID | str) -> Conversation:
    """Forget the agent's memory: ``memory_since`` = now, so the next sandbox is not seeded
    with earlier turns, and after commit the current sandbox is stopped by its node. The
    transcript (runs, events) stays. Raises ``NotFound`` (404) for another user's
    conversation, ``Conflict`` (409, ``run_active``) while a run is active (cancel it first)."""
    from sandboxes.services import sandbox_stop_for_conversation

    with transaction.atomic():
        conversation = _locked(user=user, conversation_id=conversation_id)
        if Run.objects.filter(conversation=conversation, status__in=Run.ACTIVE_STATUSES).exists():
            raise Conflict(
                "A run is active in this conversation; cancel it first.", code="run_active"
            )
        conversation.memory_since = timezone.now()
        conversation.save(update_fields=["memory_since", "updated_at"])
        sandbox_stop_for_conversation(conversation_id=conversation.id)
    return conversation
