"""Writes for conversations: create, update, delete, and forgetting the agent's memory."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from accounts.models import User
from conversations.models import Conversation, Run, Share
from conversations.selectors.conversations import conversation_get
from conversations.services.events import conversation_deleted_publish
from conversations.services.live_status import (
    conversation_changed_publish,
    conversation_removed_publish,
)
from conversations.services.workspaces import (
    share_folder_remove,
    workspace_ensure,
    workspace_remove,
)
from paw_project.errors import Conflict, InvalidRequest
from sandboxes.enqueue import sandbox_stop_enqueue, sandbox_stop_on_commit
from secrets_vault.services import datasources_validate, provider_choice_check

UPDATABLE_FIELDS = (
    "title",
    "auto_approve",
    "llm_provider",
    "llm_model",
    "approval_timeout_seconds",
    "datasources",
)
#: Bounds of a conversation's own approval timeout (seconds).
MIN_APPROVAL_TIMEOUT_SECONDS = 10
MAX_APPROVAL_TIMEOUT_SECONDS = 86_400


def _timeout_check(value: int | None) -> None:
    if value is not None and not (
        MIN_APPROVAL_TIMEOUT_SECONDS <= value <= MAX_APPROVAL_TIMEOUT_SECONDS
    ):
        raise InvalidRequest(
            f"approval_timeout_seconds is {MIN_APPROVAL_TIMEOUT_SECONDS} to "
            f"{MAX_APPROVAL_TIMEOUT_SECONDS} seconds, or null for the server default.",
            code="invalid_timeout",
        )


def conversation_create(
    *,
    user: User,
    title: str = "",
    auto_approve: bool = False,
    llm_provider: str = "",
    llm_model: str = "",
    approval_timeout_seconds: int | None = None,
    datasources: list[str] | None = None,
) -> Conversation:
    """A new conversation of ``user``; its workspace folder is created after commit.
    ``approval_timeout_seconds``: how long its approvals wait (10 to 86,400 s; None: the
    server default); out of bounds is :class:`InvalidRequest` ``invalid_timeout``; a
    provider or model the user cannot use is refused as a run's would be
    (``unknown_provider``, ``provider_inactive``, ``unknown_model``, ``provider_required``).
    ``datasources``: slugs of enabled datasources ``user`` may use, its runs are given
    by default (an unknown or disabled one, or one ``user`` may not use, is
    :class:`InvalidRequest` ``unknown_datasource``)."""
    _timeout_check(approval_timeout_seconds)
    provider_choice_check(
        user=user, llm_provider=llm_provider, llm_model=llm_model,
        where="the conversation's default",
    )  # fmt: skip
    slugs = datasources_validate(slugs=datasources, user=user)
    conversation = Conversation.objects.create(
        user=user,
        title=title,
        auto_approve=auto_approve,
        llm_provider=llm_provider,
        llm_model=llm_model,
        approval_timeout_seconds=approval_timeout_seconds,
        datasources=slugs,
    )
    transaction.on_commit(lambda: workspace_ensure(conversation.id))
    conversation_changed_publish(conversation_id=conversation.id)
    return conversation


def conversation_update(*, user: User, conversation_id: UUID | str, **fields: Any) -> Conversation:
    """Change any of ``title``, ``auto_approve``, ``llm_provider``, ``llm_model``,
    ``approval_timeout_seconds``, ``datasources`` (only the ones given; a new timeout holds
    for approvals asked from then on, and the next run restarts the sandbox with it; the
    datasources are given to the runs started from then on that name none). Raises
    ``NotFound`` (404) for another user's conversation, ``InvalidRequest``
    ``invalid_timeout``, ``unknown_datasource`` or, for a provider or model the user
    cannot use, as :func:`conversation_create` (nothing changed); ``TypeError`` for other
    field names (a programming error). Clearing the provider (``""``) without naming a
    model clears the model too."""
    unknown = set(fields) - set(UPDATABLE_FIELDS)
    if unknown:
        raise TypeError(f"not updatable: {sorted(unknown)}")
    if "approval_timeout_seconds" in fields:
        _timeout_check(fields["approval_timeout_seconds"])
    if "datasources" in fields:
        fields["datasources"] = datasources_validate(slugs=fields["datasources"], user=user)
    with transaction.atomic():
        conversation = conversation_get(user=user, conversation_id=conversation_id, for_update=True)
        if "llm_provider" in fields or "llm_model" in fields:
            provider = fields.get("llm_provider", conversation.llm_provider)
            model = fields.get("llm_model", conversation.llm_model if provider else "")
            if not provider and "llm_model" not in fields:
                fields["llm_model"] = ""
            provider_choice_check(
                user=user, llm_provider=provider, llm_model=model,
                where="the conversation's default",
            )  # fmt: skip
        for name, value in fields.items():
            setattr(conversation, name, value)
        if fields:
            conversation.save(update_fields=[*fields, "updated_at"])
        if "title" in fields:
            conversation_changed_publish(conversation_id=conversation.id)
    return conversation


def conversation_delete(*, user: User, conversation_id: UUID | str) -> None:
    """Delete the conversation with its files, runs, events, approvals and shares; after commit,
    its sandbox is stopped (by the node that owns it), its workspace folder removed and
    its open websockets closed (4404).
    Raises ``NotFound`` (404) for another user's conversation."""
    with transaction.atomic():
        conversation = conversation_get(user=user, conversation_id=conversation_id, for_update=True)
        deleted_id = conversation.id
        # Read before the delete (the sandbox rows naming the owning node go with it), sent
        # after the commit.
        sandbox_stop_on_commit(conversation_id=deleted_id)
        # Its shares go with it (their links answer 404), and their snapshots' files.
        shares = list(Share.objects.filter(conversation=conversation).values_list("id", flat=True))
        conversation.delete()
        transaction.on_commit(lambda: workspace_remove(deleted_id))
        for share_id in shares:
            transaction.on_commit(lambda share_id=share_id: share_folder_remove(share_id))
        # Its open tabs are closed (4404), not left waiting on a run that is gone.
        transaction.on_commit(lambda: conversation_deleted_publish(conversation_id=deleted_id))
        conversation_removed_publish(conversation_id=deleted_id, user_id=user.pk)


def conversation_session_reset(*, user: User, conversation_id: UUID | str) -> Conversation:
    """Forget the agent's memory: ``memory_since`` = now, so the next sandbox is not seeded
    with earlier turns, and after commit the current sandbox is stopped by its node. The
    transcript (runs, events) stays. Raises ``NotFound`` (404) for another user's
    conversation, ``Conflict`` (409, ``run_active``) while a run is active (cancel it first)."""
    with transaction.atomic():
        conversation = conversation_get(user=user, conversation_id=conversation_id, for_update=True)
        if Run.objects.filter(conversation=conversation, status__in=Run.ACTIVE_STATUSES).exists():
            raise Conflict(
                "A run is active in this conversation; cancel it first.", code="run_active"
            )
        conversation.memory_since = timezone.now()
        conversation.save(update_fields=["memory_since", "updated_at"])
        reset_id = conversation.id
        transaction.on_commit(lambda: sandbox_stop_enqueue(conversation_id=reset_id))
    return conversation
