"""Reads of uploaded files (``ConversationFile``), scoped to the conversation's owner."""

from __future__ import annotations

import os
from uuid import UUID

from django.db.models import QuerySet

from accounts.models import User
from conversations.models import Conversation, ConversationFile
from conversations.selectors.artifacts import OpenArtifact, content_type_for
from conversations.selectors.conversations import conversation_get
from conversations.selectors.workspaces import workspace_open, workspace_path
from paw_project.errors import NotFound


def uploads_gone(*, conversation: Conversation) -> list[UUID]:
    """Ids of the conversation's upload records whose file is no longer in the workspace
    (the agent deleted it; a symlink, even dangling, still counts as there)."""
    folder = workspace_path(conversation.id)
    return [
        pk
        for pk, name in ConversationFile.objects.filter(conversation=conversation).values_list(
            "pk", "name"
        )
        if not os.path.lexists(folder / name)
    ]


def file_list(*, user: User, conversation_id: UUID | str) -> QuerySet[ConversationFile]:
    """The files uploaded to the user's conversation that are still in its workspace (the
    agent may have deleted one), oldest first. Raises ``NotFound``."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    return (
        ConversationFile.objects.filter(conversation=conversation)
        .exclude(pk__in=uploads_gone(conversation=conversation))
        .order_by("created_at", "id")
    )


def file_get(*, user: User, conversation_id: UUID | str, file_id: UUID | str) -> ConversationFile:
    """One uploaded file of the user's conversation. Raises ``NotFound`` (404) for another
    user's conversation or a file of another conversation."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    try:
        return ConversationFile.objects.get(pk=file_id, conversation=conversation)
    except (ConversationFile.DoesNotExist, ValueError) as error:
        raise NotFound("No such file.", code="not_found") from error


def file_open(*, user: User, conversation_id: UUID | str, file_id: UUID | str) -> OpenArtifact:
    """Open an uploaded file for download (its current bytes in the workspace). Raises
    ``NotFound`` like :func:`file_get`, and when the file is gone from the workspace or was
    replaced by something that must not be served (see ``conversations.selectors.workspaces``)."""
    upload = file_get(user=user, conversation_id=conversation_id, file_id=file_id)
    opened = workspace_open(upload.conversation_id, upload.name)
    if opened is None:
        raise NotFound("The file is no longer in the workspace.", code="not_found")
    file, size = opened
    # The type is guessed from the name, never taken from what the uploading client said.
    return OpenArtifact(
        file=file, name=upload.name, size=size, content_type=content_type_for(upload.name)
    )
