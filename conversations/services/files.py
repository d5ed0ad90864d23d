"""Writes for uploaded files: naming, placing a staged upload, deleting."""

from __future__ import annotations

import contextlib
import os
import unicodedata
from collections.abc import Iterator
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from accounts.models import User
from conversations.models import Conversation, ConversationFile
from conversations.selectors.artifacts import content_type_for
from conversations.selectors.files import file_get, uploads_gone
from conversations.selectors.workspaces import workspace_path
from conversations.services.workspaces import workspace_ensure
from conversations.uploads import StagedUpload
from paw_project.errors import Conflict, NotFound

# Leaves room under the usual 255-byte file name limit for a " (999)" suffix.
FILE_NAME_MAX_BYTES = 240
FILE_NAME_FALLBACK = "upload"
_SUFFIX_ATTEMPTS = 1000


def file_name_clean(raw: str) -> str:
    """The name an upload is stored under, from the name the client sent.

    Unicode is kept, normalised to NFC (``données Q3 (final).xlsx``, ``报表.csv``); any path
    part is dropped (``../../x.txt`` → ``x.txt``, backslashes count as separators); control
    and other invisible format characters (``\\x00``, U+202E …) are removed; leading dots
    (which would hide the file in, or clash with, the runtime's private dot-folders) and
    surrounding spaces and trailing dots are stripped; an empty result becomes ``upload``;
    the name is cut to at most 240 UTF-8 bytes, keeping its extension.
    """
    name = unicodedata.normalize("NFC", raw).replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(ch for ch in name if unicodedata.category(ch)[0] != "C")
    name = name.strip().lstrip(".").strip().rstrip(". ")
    if not name:
        return FILE_NAME_FALLBACK
    if len(name.encode()) > FILE_NAME_MAX_BYTES:
        stem, dot, extension = name.rpartition(".")
        if not dot or len(extension.encode()) > 16:
            stem, extension = name, ""
        suffix = f".{extension}" if extension else ""
        budget = FILE_NAME_MAX_BYTES - len(suffix.encode())
        stem = stem.encode()[:budget].decode(errors="ignore").rstrip(". ")
        name = f"{stem}{suffix}" or FILE_NAME_FALLBACK
    return name


def _name_candidates(name: str) -> Iterator[str]:
    """``tips.csv``, ``tips (1).csv``, ``tips (2).csv`` …"""
    yield name
    stem, dot, extension = name.rpartition(".")
    if not dot or not stem:
        stem, extension = name, ""
    suffix = f".{extension}" if extension else ""
    for number in range(1, _SUFFIX_ATTEMPTS):
        yield f"{stem} ({number}){suffix}"


def file_create(
    *, user: User, conversation_id: UUID | str, upload: StagedUpload
) -> ConversationFile:
    """Give a staged upload (see ``conversations.uploads``) its final name in the workspace
    and record it; bumps the conversation's activity.

    Records of earlier uploads the agent deleted from the workspace are dropped first. The
    name is :func:`file_name_clean`'s; when a file of that name is already there,
    uploaded *or made by the agent*, the upload gets the first free ``name (n).ext``: an
    upload never overwrites anything in the workspace. The staged file is moved with a
    hard link that fails if the name was taken meanwhile (no overwrite even if the runtime
    writes at the same moment). Raises ``NotFound`` (404) for another user's conversation,
    ``Conflict`` (409, ``name_exhausted``) when 1000 names are taken. The staged file is
    gone afterwards in every case.
    """
    name = file_name_clean(upload.name)
    try:
        with transaction.atomic():
            try:
                conversation = Conversation.objects.select_for_update().get(
                    pk=conversation_id, user=user
                )
            except (Conversation.DoesNotExist, ValueError) as error:
                raise NotFound("No such conversation.", code="not_found") from error
            folder = workspace_ensure(conversation.id)
            uploads = ConversationFile.objects.filter(conversation=conversation)
            # Records of uploads the agent has deleted since free their names.
            gone = uploads_gone(conversation=conversation)
            if gone:
                uploads.filter(pk__in=gone).delete()
            taken = set(uploads.values_list("name", flat=True))
            final = _place(upload, folder, name, taken)
            try:
                created = ConversationFile.objects.create(
                    conversation=conversation,
                    name=final.name,
                    size=upload.size,
                    sha256=upload.sha256,
                    content_type=content_type_for(final.name),
                )
                conversation.last_activity_at = timezone.now()
                conversation.save(update_fields=["last_activity_at", "updated_at"])
            except BaseException:
                final.unlink(missing_ok=True)
                raise
    finally:
        upload.discard()
    return created


def _place(upload: StagedUpload, folder, name: str, taken: set[str]):
    """Hard-link the staged file to the first free candidate name; the link (not the
    staged name) is the file's path."""
    for candidate in _name_candidates(name):
        if candidate in taken:
            continue
        target = folder / candidate
        try:
            os.link(upload.path, target)
        except FileExistsError:
            continue
        return target
    raise Conflict("Too many files with this name; rename it.", code="name_exhausted")


def file_delete(*, user: User, conversation_id: UUID | str, file_id: UUID | str) -> None:
    """Delete an uploaded file: its record, and once that is committed, its file in the
    workspace (whatever is at that name now; a symlink is removed, not followed). Raises
    ``NotFound`` (404) for another user's conversation or file."""
    upload = file_get(user=user, conversation_id=conversation_id, file_id=file_id)
    path = workspace_path(upload.conversation_id) / upload.name
    with transaction.atomic():
        upload.delete()

        def remove() -> None:
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                path.unlink()

        transaction.on_commit(remove)
