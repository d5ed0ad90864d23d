"""Reads of artifacts: the files the agent made in a conversation's workspace."""

from __future__ import annotations

import mimetypes
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import BinaryIO
from uuid import UUID

from accounts.models import User
from conversations.models import ConversationFile
from conversations.selectors.conversations import conversation_get
from conversations.selectors.workspaces import workspace_files, workspace_open
from paw_project.errors import NotFound

# Types a browser may show inline (``?inline=1``): raster images only, never SVG or HTML,
# which can carry script.
INLINE_CONTENT_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def content_type_for(name: str) -> str:
    """The content type guessed from the file name's extension, else
    ``application/octet-stream``."""
    return mimetypes.guess_type(name, strict=False)[0] or "application/octet-stream"


@dataclass(frozen=True)
class Artifact:
    """An artifact: ``path`` relative to the workspace (``/``-separated), ``size`` (bytes),
    ``modified`` (aware datetime), ``content_type`` (guessed from the extension)."""

    path: str
    size: int
    modified: datetime
    content_type: str


@dataclass
class OpenArtifact:
    """An artifact opened for download: ``file`` (binary, the caller closes it), ``name`` (the
    last path part), ``size`` (bytes), ``content_type``."""

    file: BinaryIO
    name: str
    size: int
    content_type: str


#: Seconds after an upload was recorded within which its file's modification time still
#: counts as the upload's own (the file is written just before the record).
UPLOAD_MTIME_SLACK = timedelta(seconds=2)


def artifact_list(*, user: User, conversation_id: UUID | str) -> list[Artifact]:
    """The artifacts of the user's conversation, recursively, sorted by path: every regular
    file of the workspace except the uploads as they were uploaded (top-level files named
    like a :class:`ConversationFile`, of its size, not modified since) and the runtime's
    private dot-folders. An upload the agent rewrote is listed: it is the agent's work now.
    Raises ``NotFound``."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    uploads = {
        name: (size, created)
        for name, size, created in ConversationFile.objects.filter(
            conversation=conversation
        ).values_list("name", "size", "created_at")
    }

    def as_uploaded(entry) -> bool:
        upload = uploads.get(entry.path)
        if upload is None:
            return False
        size, created = upload
        return entry.size == size and entry.modified <= created + UPLOAD_MTIME_SLACK

    return [
        Artifact(
            path=entry.path,
            size=entry.size,
            modified=entry.modified,
            content_type=content_type_for(entry.path),
        )
        for entry in workspace_files(conversation.id)
        if not as_uploaded(entry)
    ]


def artifact_open(*, user: User, conversation_id: UUID | str, path: str) -> OpenArtifact:
    """Open the file at ``path`` (relative, ``/``-separated) in the user's conversation's
    workspace for download.

    Raises ``NotFound`` (404) for another user's conversation and for any path that must not
    be served: ``..``, absolute, private (dot parts), missing, not a regular file, or a
    symlink leading outside the workspace (see ``conversations.selectors.workspaces``).
    """
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    opened = workspace_open(conversation.id, path)
    if opened is None:
        raise NotFound("No such artifact.", code="not_found")
    file, size = opened
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return OpenArtifact(file=file, name=name, size=size, content_type=content_type_for(name))
