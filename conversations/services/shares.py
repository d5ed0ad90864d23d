"""Writes of shared conversations: share a snapshot, update it, stop it, fork it.

A share is a snapshot (see :class:`~conversations.models.Share`): the conversation's
finished runs, its events up to the moment it was taken and copies of its workspace
files, so what the audience sees does not move with the conversation. Updating a share
takes a new snapshot under the same link; stopping it deletes it and its files at once.

A fork is a new conversation of the person who views the share: the snapshot's runs,
events and decided approvals copied (so the chat page shows the transcript, and the agent
is seeded with its turns as with any conversation's: ``conversation_turns``), its files
copied into the new workspace (uploads as uploads), and of the conversation's datasources
only those the person may use.

Nothing of the owner's secrets: the events are stored masked already; the snapshot's
text files (UTF-8) are masked the same way with every secret value PAW keeps for the
owner's sandboxes (``stored_secret_values``), and a binary file that holds one (as UTF-8
or UTF-16 bytes, or one of the forms masking knows, also inside a zip file's members —
xlsx, docx — or a gzip file, inflated at most :data:`SCAN_MAX_INFLATED_BYTES`: one
inflating further is left out unchecked) is left out.

Bounded work: a snapshot copies at most :data:`SHARE_MAX_FILES` files, each at most
``PAW_MAX_UPLOAD_BYTES`` and :data:`SHARE_MAX_FILES_BYTES` in all (the others are named in
``files_left_out``), in chunks, each read no further than those limits allow (a file that
grew since it was listed is left out too); events are copied :data:`CHUNK_EVENTS` at a time.
"""

from __future__ import annotations

import codecs
import functools
import gzip
import hashlib
import shutil
import uuid
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path, PurePosixPath
from typing import IO, Any
from uuid import UUID

from ahocorasick_rs import AhoCorasick
from django.conf import settings
from django.db import transaction
from django.utils import timezone

from accounts.models import User
from conversations.models import Approval, Conversation, ConversationFile, Run, Share
from conversations.selectors.artifacts import artifact_list, content_type_for
from conversations.selectors.conversations import conversation_get
from conversations.selectors.events import conversation_cursor
from conversations.selectors.shares import (
    conversation_share_get,
    share_events_all,
    share_file_open,
    share_for_viewer,
    share_runs,
    sharing_allows,
)
from conversations.selectors.workspaces import (
    share_folder,
    workspace_files,
    workspace_open,
    workspace_path,
)
from conversations.services.conversations import conversation_create
from conversations.services.events import StoredEvent, events_store
from conversations.services.workspaces import (
    share_folder_remove,
    workspace_ensure,
    workspace_remove,
)
from paw_project.errors import Forbidden, InvalidRequest
from secrets_vault.masking import MIN_MASKED_LENGTH, StreamMasker, secret_forms
from secrets_vault.services import datasources_available, stored_secret_values
from teams.selectors import user_team_ids

#: Shares one conversation may have at once.
MAX_SHARES_PER_CONVERSATION = 20
#: Days a share may be given until it expires (``expires_in_days``).
SHARE_MAX_DAYS = 365
#: Workspace files one snapshot copies at most.
SHARE_MAX_FILES = 1000
#: Bytes of workspace files one snapshot copies in all.
SHARE_MAX_FILES_BYTES = 256 * 1024 * 1024
#: Bytes copied at a time.
COPY_BYTES = 256 * 1024
#: Bytes of a file's start that tell text (masked) from binary.
SNIFF_BYTES = 8192
#: Bytes a compressed file (a zip's members together, a gzip) is inflated to at most when
#: it is looked through for secrets; one inflating further is left out unchecked.
SCAN_MAX_INFLATED_BYTES = 128 * 1024 * 1024
#: How a gzip file starts.
GZIP_MAGIC = b"\x1f\x8b"
#: Events (and runs, approvals) a fork writes at a time.
CHUNK_EVENTS = 500
#: Left out: keep the share's expiry as it is (``share_update``).
KEEP = object()


def _sharing_on() -> None:
    if settings.PAW_SHARING == "off":
        raise Forbidden(
            "Sharing conversations is turned off on this server (PAW_SHARING=off).",
            code="sharing_off",
        )


def _audience_allowed(audience: str) -> None:
    if not sharing_allows(audience):
        raise InvalidRequest(
            "This server allows sharing with your teams only (PAW_SHARING=teams): "
            'use {"audience": "teams", "teams": [...]}.',
            code="audience_not_allowed",
        )


def _team_ids_checked(user: User, audience: str, teams: list[int] | None) -> list[int]:
    """The team ids of a share, checked: none for ``signed_in``; for ``teams`` at least
    one, each a team ``user`` is a member of (else ``unknown_team`` naming them)."""
    if audience == Share.Audience.SIGNED_IN:
        if teams:
            raise InvalidRequest(
                'teams are named only with "audience": "teams".', code="invalid_teams"
            )
        return []
    wanted = list(dict.fromkeys(teams or []))
    if not wanted:
        raise InvalidRequest(
            "Name at least one of your teams to share with.", code="teams_required"
        )
    mine = user_team_ids(user)
    unknown = [team for team in wanted if team not in mine]
    if unknown:
        raise InvalidRequest(
            f"Not a team of yours: {', '.join(str(t) for t in unknown)}. A conversation is "
            "shared only with teams its owner is a member of.",
            code="unknown_team",
            extra={"teams": unknown},
        )
    return wanted


def _teams_still_yours(user: User, share: Share) -> None:
    """Refuse to update a ``teams`` share whose owner left one of its teams (naming them)
    or none of whose teams is left (a deleted team): stop it and share anew."""
    if share.audience != Share.Audience.TEAMS:
        return
    mine = user_team_ids(user)
    team_ids = sorted(share.teams.values_list("id", flat=True))
    lost = [team for team in team_ids if team not in mine]
    if lost:
        raise InvalidRequest(
            f"No longer a team of yours: {', '.join(str(t) for t in lost)}. A conversation "
            "is shared only with teams its owner is a member of: stop this share and share "
            "anew.",
            code="unknown_team",
            extra={"teams": lost},
        )
    if not team_ids:
        raise InvalidRequest(
            "None of this share's teams is left: stop it and share anew.",
            code="teams_required",
        )


def _expiry(expires_in_days: int | None) -> datetime | None:
    if expires_in_days is None:
        return None
    if not 1 <= expires_in_days <= SHARE_MAX_DAYS:
        raise InvalidRequest(
            f"expires_in_days is 1 to {SHARE_MAX_DAYS}, or null for never.",
            code="invalid_expiry",
        )
    return timezone.now() + timedelta(days=expires_in_days)


# --- the snapshot ---------------------------------------------------------------------------


@dataclass
class _Snapshot:
    run_ids: list[UUID]
    cursor: int
    title: str
    taken_at: datetime
    files: list[dict[str, Any]] = field(default_factory=list)
    files_left_out: list[dict[str, Any]] = field(default_factory=list)


class _TooLarge(Exception):
    """A file went past the bytes it may have while it was copied (it grew meanwhile)."""

    def __init__(self, size: int) -> None:
        super().__init__(size)
        self.size = size


class _Bounded:
    """``source`` read no further than offset ``limit``: reading past it raises
    :class:`_TooLarge` (a file that grew since it was listed). Seekable, as a zip file's
    reader needs."""

    def __init__(self, source: IO[bytes], limit: int | None) -> None:
        self.source, self.limit = source, limit

    def read(self, size: int = -1) -> bytes:
        if self.limit is not None:
            allowed = max(self.limit - self.source.tell() + 1, 0)  # one more: it went past
            size = allowed if size is None or size < 0 else min(size, allowed)
        data = self.source.read(size)
        if self.limit is not None and self.source.tell() > self.limit:
            raise _TooLarge(self.source.tell())
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return self.source.seek(offset, whence)

    def tell(self) -> int:
        return self.source.tell()

    def seekable(self) -> bool:
        return True


class _Hashing:
    """A file written through, its bytes counted and hashed (SHA-256), at most ``limit``
    of them (past it :class:`_TooLarge`)."""

    def __init__(self, out: IO[bytes], limit: int | None = None) -> None:
        self.out, self.size, self.digest, self.limit = out, 0, hashlib.sha256(), limit

    def write(self, data: bytes) -> None:
        if self.limit is not None and self.size + len(data) > self.limit:
            raise _TooLarge(self.size + len(data))
        self.out.write(data)
        self.size += len(data)
        self.digest.update(data)


def _is_text(source: IO[bytes]) -> bool:
    """Whether ``source`` starts as UTF-8 text without NUL bytes (then it is masked as
    text); it is read back to its start."""
    head = source.read(SNIFF_BYTES)
    source.seek(0)
    if b"\0" in head:
        return False
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return False
    return True


def _copy_masked(source: IO[bytes], out: _Hashing, secret_values: dict[str, str]) -> bool:
    """Copy the text of ``source`` with every secret value masked (``[secret:NAME]``,
    as in events); ``False`` when it turns out not to be UTF-8 after all."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    masker = StreamMasker(secret_values)
    try:
        while chunk := source.read(COPY_BYTES):
            out.write(masker.feed(decoder.decode(chunk)).encode())
        out.write((masker.feed(decoder.decode(b"", final=True)) + masker.flush()).encode())
    except UnicodeDecodeError:
        return False
    return True


class _Unchecked(Exception):
    """A compressed file (or member) inflates past :data:`SCAN_MAX_INFLATED_BYTES`: it
    cannot be checked for secrets within bounds, so it is left out."""


@functools.lru_cache(maxsize=64)
def _needles(items: tuple[tuple[str, str], ...]) -> tuple[AhoCorasick | None, int]:
    """The byte strings a file holding one of the values would hold: each value and each
    form masking knows (:func:`~secrets_vault.masking.secret_forms`), as UTF-8, UTF-16 LE
    and UTF-16 BE, matched by one automaton over bytes read as latin-1 (one character a
    byte). Returns ``(automaton, longest needle in bytes)``."""
    patterns: set[str] = set()
    for _, value in items:
        if len(value) < MIN_MASKED_LENGTH:
            continue
        for form in (value, *secret_forms(value)):
            for encoding in ("utf-8", "utf-16-le", "utf-16-be"):
                patterns.add(form.encode(encoding).decode("latin-1"))
    if not patterns:
        return None, 0
    return AhoCorasick(sorted(patterns)), max(len(p) for p in patterns)


class _Scan:
    """Bytes fed in chunks, looked through for the needles of ``secret_values`` (see
    :func:`_needles`); chunks overlap by the longest needle, so memory stays bounded."""

    def __init__(self, secret_values: dict[str, str]) -> None:
        self.automaton, longest = _needles(tuple(sorted(secret_values.items())))
        self.overlap = max(longest - 1, 0)
        self.tail = ""

    def feed(self, chunk: bytes) -> bool:
        """Whether the bytes so far hold a needle."""
        if self.automaton is None:
            return False
        window = self.tail + chunk.decode("latin-1")
        if self.automaton.find_matches_as_indexes(window):
            return True
        self.tail = window[-self.overlap :] if self.overlap else ""
        return False


class _Inflated:
    """What inflating one compressed file may still cost: :data:`SCAN_MAX_INFLATED_BYTES`
    in all its members together; past it :class:`_Unchecked`."""

    def __init__(self) -> None:
        self.left = SCAN_MAX_INFLATED_BYTES

    def read(self, stream: IO[bytes]) -> Iterator[bytes]:
        """``stream``'s bytes in chunks, counted against what is left."""
        while chunk := stream.read(min(COPY_BYTES, self.left + 1)):
            self.left -= len(chunk)
            if self.left < 0:
                raise _Unchecked
            yield chunk


def _scan_stream(chunks: Iterator[bytes], secret_values: dict[str, str]) -> bool:
    scan = _Scan(secret_values)
    return any(scan.feed(chunk) for chunk in chunks)


def _zip_holds_a_secret(source: Any, secret_values: dict[str, str]) -> bool:
    """Whether a member of the zip file ``source`` (xlsx, docx, zip: each member inflated,
    :data:`SCAN_MAX_INFLATED_BYTES` in all) holds a secret; a member that cannot be read
    (encrypted, an unknown compression) cannot be checked (:class:`_Unchecked`)."""
    budget = _Inflated()
    try:
        with zipfile.ZipFile(source) as archive:
            for info in archive.infolist():
                if info.is_dir():
                    continue
                with archive.open(info) as member:
                    if _scan_stream(budget.read(member), secret_values):
                        return True
    except (zipfile.BadZipFile, RuntimeError, NotImplementedError, OSError, EOFError) as e:
        raise _Unchecked from e
    return False


def _gzip_holds_a_secret(source: Any, secret_values: dict[str, str]) -> bool:
    """Whether the gzip file ``source``, inflated (:data:`SCAN_MAX_INFLATED_BYTES` at
    most), holds a secret; what inflates before an error in it is looked through."""
    budget = _Inflated()
    scan = _Scan(secret_values)
    try:
        with gzip.GzipFile(fileobj=source, mode="rb") as inflated:
            return any(scan.feed(chunk) for chunk in budget.read(inflated))
    except (OSError, EOFError, zlib.error):
        return False


def _holds_a_secret(source: Any, secret_values: dict[str, str]) -> bool:
    """Whether the bytes of ``source`` hold a secret value (or one of its masked forms)
    as UTF-8 or UTF-16 (LE or BE), or, a zip or gzip file, once inflated; read in chunks
    that overlap by the longest needle, then back to its start. Raises
    :class:`_Unchecked` for a compressed file past what may be inflated."""
    try:
        if _scan_stream(iter(lambda: source.read(COPY_BYTES), b""), secret_values):
            return True
        source.seek(0)
        if source.read(2) == GZIP_MAGIC:
            source.seek(0)
            return _gzip_holds_a_secret(source, secret_values)
        source.seek(0)
        if zipfile.is_zipfile(source):
            source.seek(0)
            return _zip_holds_a_secret(source, secret_values)
        return False
    finally:
        source.seek(0)


def _copy_stream(
    source: IO[bytes],
    target: Path,
    secret_values: dict[str, str] | None = None,
    limit: int | None = None,
) -> tuple[int, str] | None:
    """Copy ``source`` into a new file at ``target`` (its folders made, mode 0700):
    text masked with ``secret_values``; a binary file that holds one of them is not
    copied (``None``), nor a compressed one too large to check (:class:`_Unchecked`).
    With ``limit``, at most that many bytes are read and written: a
    file past it (one that grew since it was listed) raises :class:`_TooLarge`, nothing
    of it left at ``target``. Returns ``(size, sha256)`` of what was written."""
    with source:
        try:
            return _copy_bounded(_Bounded(source, limit), target, secret_values, limit)
        except (_TooLarge, _Unchecked):
            target.unlink(missing_ok=True)
            raise


def _copy_bounded(
    source: Any, target: Path, secret_values: dict[str, str] | None, limit: int | None
) -> tuple[int, str] | None:
    """:func:`_copy_stream` of a :class:`_Bounded` source."""
    if secret_values and not _is_text(source) and _holds_a_secret(source, secret_values):
        return None
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(target, "xb") as file:
        out = _Hashing(file, limit)
        if secret_values and _is_text(source):
            if _copy_masked(source, out, secret_values):
                return out.size, out.digest.hexdigest()
            source.seek(0)
            file.seek(0)
            file.truncate()
            out = _Hashing(file, limit)
            if _holds_a_secret(source, secret_values):
                file.close()
                target.unlink()
                return None
        while chunk := source.read(COPY_BYTES):
            out.write(chunk)
        return out.size, out.digest.hexdigest()


def _snapshot_files(conversation: Conversation, folder: Path) -> tuple[list, list]:
    """Copy the conversation's workspace files (not the runtime's private dot-folders)
    into ``folder``, within the limits. Returns ``(files, files_left_out)``."""
    made = {a.path for a in artifact_list(user=conversation.user, conversation_id=conversation.id)}
    secret_values = stored_secret_values(user=conversation.user)
    uploads = {f.name: f for f in ConversationFile.objects.filter(conversation=conversation)}
    files: list[dict[str, Any]] = []
    left_out: list[dict[str, Any]] = []
    used = 0
    for entry in workspace_files(conversation.id):
        reason = ""
        if len(files) >= SHARE_MAX_FILES:
            reason = f"more than {SHARE_MAX_FILES} files"
        elif entry.size > settings.PAW_MAX_UPLOAD_BYTES:
            reason = "larger than PAW_MAX_UPLOAD_BYTES"
        elif used + entry.size > SHARE_MAX_FILES_BYTES:
            reason = f"past {SHARE_MAX_FILES_BYTES // (1024 * 1024)} MiB of files in all"
        opened = None if reason else workspace_open(conversation.id, entry.path)
        if opened is None:
            left_out.append({"path": entry.path, "size": entry.size, "reason": reason or "gone"})
            continue
        source, _ = opened
        # The listing's size may be past already: the file is read no further than it may
        # be (each at most PAW_MAX_UPLOAD_BYTES, and what is left of the total).
        per_file, left = settings.PAW_MAX_UPLOAD_BYTES, SHARE_MAX_FILES_BYTES - used
        try:
            copied = _copy_stream(
                source, folder / PurePosixPath(entry.path), secret_values, min(per_file, left)
            )
        except _Unchecked:
            reason = (
                f"compressed, inflating past {SCAN_MAX_INFLATED_BYTES // (1024 * 1024)} MiB: "
                "not checked for secrets"
            )
            left_out.append({"path": entry.path, "size": entry.size, "reason": reason})
            continue
        except _TooLarge as grown:
            reason = (
                "larger than PAW_MAX_UPLOAD_BYTES"
                if per_file <= left
                else f"past {SHARE_MAX_FILES_BYTES // (1024 * 1024)} MiB of files in all"
            )
            left_out.append({"path": entry.path, "size": grown.size, "reason": reason})
            continue
        if copied is None:
            left_out.append({"path": entry.path, "size": entry.size, "reason": "holds a secret"})
            continue
        size, sha256 = copied
        upload = uploads.get(entry.path) if entry.path not in made else None
        files.append(
            {"path": entry.path, "size": size, "upload": upload is not None, "sha256": sha256}
        )
        used += size
    return files, left_out


def _snapshot_take(conversation: Conversation, share_id: UUID, number: int) -> _Snapshot:
    """The conversation as it is now: its finished runs, then (so that every event of
    those runs is below it) the cursor of its latest event, and its files copied into the
    snapshot's folder (removed again should the copy fail)."""
    run_ids = list(
        Run.objects.filter(conversation=conversation, status__in=Run.FINISHED_STATUSES).values_list(
            "id", flat=True
        )
    )
    snapshot = _Snapshot(
        run_ids=run_ids,
        cursor=conversation_cursor(conversation_id=conversation.id),
        title=conversation.title,
        taken_at=timezone.now(),
    )
    folder = share_folder(share_id, number)
    shutil.rmtree(folder, ignore_errors=True)  # a failed earlier attempt's leftovers
    try:
        snapshot.files, snapshot.files_left_out = _snapshot_files(conversation, folder)
    except BaseException:
        share_folder_remove(share_id, number)
        raise
    return snapshot


def _snapshot_apply(share: Share, snapshot: _Snapshot, number: int) -> None:
    share.title = snapshot.title
    share.cursor = snapshot.cursor
    share.snapshot = number
    share.snapshot_at = snapshot.taken_at
    share.files = snapshot.files
    share.files_left_out = snapshot.files_left_out


# --- create, update, stop -----------------------------------------------------------------------


def share_create(
    *,
    user: User,
    conversation_id: UUID | str,
    audience: str,
    teams: list[int] | None = None,
    expires_in_days: int | None = None,
) -> Share:
    """Share the user's conversation as it is now with ``audience`` (``teams``: the
    members of ``teams``, ids of teams the user is a member of; ``signed_in``: every
    signed-in person), until ``expires_in_days`` days from now (1 to 365; ``None``:
    never).

    Raises ``Forbidden`` (403) ``sharing_off`` under ``PAW_SHARING=off``;
    ``InvalidRequest`` (400) ``audience_not_allowed`` for an audience ``PAW_SHARING`` does
    not allow, ``teams_required``, ``unknown_team`` (naming the ids in ``teams``: not a
    team of the user's), ``invalid_teams`` (teams with ``signed_in``), ``invalid_expiry``,
    ``too_many_shares`` (past :data:`MAX_SHARES_PER_CONVERSATION`); ``NotFound`` (404)
    for a conversation that is not the user's. Nothing is left behind on an error."""
    _sharing_on()
    _audience_allowed(audience)
    team_ids = _team_ids_checked(user, audience, teams)
    expires_at = _expiry(expires_in_days)
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    share_id = uuid.uuid4()
    try:
        with transaction.atomic():
            # The conversation's row locked until the share is in: shares made at once
            # are counted one after the other, so none passes the limit.
            Conversation.objects.select_for_update().filter(id=conversation.id).first()
            shares = Share.objects.filter(conversation=conversation).count()
            if shares >= MAX_SHARES_PER_CONVERSATION:
                raise InvalidRequest(
                    f"A conversation has at most {MAX_SHARES_PER_CONVERSATION} shares: stop "
                    "one first.",
                    code="too_many_shares",
                )
            snapshot = _snapshot_take(conversation, share_id, 1)
            share = Share(
                id=share_id,
                conversation=conversation,
                audience=audience,
                expires_at=expires_at,
                created_at=snapshot.taken_at,
            )
            _snapshot_apply(share, snapshot, 1)
            share.save(force_insert=True)
            share.teams.set(team_ids)
            share.runs.set(snapshot.run_ids)
    except BaseException:
        share_folder_remove(share_id)
        raise
    return share


def share_update(
    *,
    user: User,
    conversation_id: UUID | str,
    share_id: UUID | str,
    expires_in_days: Any = KEEP,
) -> Share:
    """Take a new snapshot of the conversation for the share, under the same link (what
    its audience sees is the conversation as it is now); with ``expires_in_days`` (1 to
    365, or ``None`` for never) its expiry is set anew from now, left out it stays. The
    earlier snapshot's files are removed once this commits.

    Raises ``Forbidden`` ``sharing_off``, ``InvalidRequest`` ``audience_not_allowed``
    (``PAW_SHARING`` no longer allows its audience: stop it and share anew) or
    ``invalid_expiry``, ``unknown_team`` (naming the share's teams the user is no longer
    a member of) or ``teams_required`` (none of its teams is left), ``NotFound`` for a
    share not of the user's conversation."""
    _sharing_on()
    expires_at = KEEP if expires_in_days is KEEP else _expiry(expires_in_days)
    with transaction.atomic():
        share = conversation_share_get(
            user=user, conversation_id=conversation_id, share_id=share_id, for_update=True
        )
        _audience_allowed(share.audience)
        _teams_still_yours(user, share)
        previous, number = share.snapshot, share.snapshot + 1
        snapshot = _snapshot_take(share.conversation, share.id, number)
        transaction.on_commit(lambda: share_folder_remove(share.id, previous))
        try:
            with transaction.atomic():
                _snapshot_apply(share, snapshot, number)
                if expires_at is not KEEP:
                    share.expires_at = expires_at
                share.save()
                share.runs.set(snapshot.run_ids)
        except BaseException:
            share_folder_remove(share.id, number)
            raise
    return share


def share_delete(*, user: User, conversation_id: UUID | str, share_id: UUID | str) -> None:
    """Stop sharing: the share is deleted (its link answers 404 from now on) and its
    snapshot's files are removed once that commits. Raises ``NotFound`` for a share not
    of the user's conversation."""
    with transaction.atomic():
        share = conversation_share_get(
            user=user, conversation_id=conversation_id, share_id=share_id, for_update=True
        )
        deleted = share.id
        share.delete()
        transaction.on_commit(lambda: share_folder_remove(deleted))


# --- fork -------------------------------------------------------------------------------------


def datasources_usable(*, user: User, slugs: list[str]) -> list[str]:
    """The datasources among ``slugs`` that ``user`` may use (enabled, and open to them
    by the access rule: ``secrets_vault.services.datasources_available``, every path's
    one rule), in the order given, without duplicates. The one place a fork decides it."""
    return datasources_available(slugs=list(slugs), user=user)


def _fork_title(title: str) -> str:
    return f"{title or 'Shared conversation'} (fork)"[:200]


def _fork_runs(
    share: Share, conversation: Conversation, user: User, usable: set[str]
) -> dict[UUID, UUID]:
    """Copy the snapshot's runs into ``conversation`` (as ``user``'s, with only the
    ``usable`` datasources, no token usage: nobody spent any in the fork). Returns old
    run id → new run id."""
    run_map: dict[UUID, UUID] = {}
    batch: list[Run] = []
    for run in share_runs(share).iterator(chunk_size=CHUNK_EVENTS):
        run_map[run.id] = uuid.uuid4()
        batch.append(
            Run(
                id=run_map[run.id],
                conversation=conversation,
                user=user,
                prompt=run.prompt,
                status=run.status,
                answer=run.answer,
                errors=run.errors,
                provider=run.provider,
                model=run.model,
                kind=run.kind,
                datasources=[slug for slug in run.datasources if slug in usable],
                tools=run.tools,
                attachments=run.attachments,
                result=run.result,
                usage={},
                replaces_id=run_map.get(run.replaces_id) if run.replaces_id else None,
                runtime_gated=run.runtime_gated,
                created_at=run.created_at,
                started_at=run.started_at,
                finished_at=run.finished_at,
            )
        )
        if len(batch) >= CHUNK_EVENTS:
            Run.objects.bulk_create(batch)
            batch = []
    Run.objects.bulk_create(batch)
    return run_map


def _fork_approvals(share: Share, conversation: Conversation, run_map: dict[UUID, UUID]) -> None:
    """Copy how the snapshot's questions and confirms were decided (the transcript shows
    it); nobody of the fork decided them, so no deciding user is named."""
    batch: list[Approval] = []
    approvals = Approval.objects.filter(run__in=share.runs.values("id")).order_by("created_at")
    for approval in approvals.iterator(chunk_size=CHUNK_EVENTS):
        batch.append(
            Approval(
                conversation=conversation,
                run_id=run_map[approval.run_id],
                kind=approval.kind,
                prompt=approval.prompt,
                questions=approval.questions,
                ask_id=approval.ask_id,
                call=approval.call,
                used_at=approval.used_at,
                status=approval.status,
                answers=approval.answers,
                decided_by=approval.decided_by,
                via=approval.via,
                created_at=approval.created_at,
                expires_at=approval.expires_at,
                decided_at=approval.decided_at,
            )
        )
        if len(batch) >= CHUNK_EVENTS:
            Approval.objects.bulk_create(batch)
            batch = []
    Approval.objects.bulk_create(batch)


def _fork_events(share: Share, conversation: Conversation, run_map: dict[UUID, UUID]) -> int:
    """Copy the snapshot's events into ``conversation`` under new cursors (1, 2, …), each
    with its new run; returns the last cursor."""
    cursor = 0
    batch: list[StoredEvent] = []
    for event in share_events_all(share):
        cursor += 1
        run_id = run_map.get(event.run_id) if event.run_id else None
        payload = event.payload
        if isinstance(payload, dict) and payload.get("run_id") == str(event.run_id):
            payload = {**payload, "run_id": str(run_id)}
        batch.append(StoredEvent(cursor, run_id, event.type, event.kind, payload, event.created_at))
        if len(batch) >= CHUNK_EVENTS:
            events_store(events={conversation.id: batch})
            batch = []
    events_store(events={conversation.id: batch})
    return cursor


def _fork_files(share: Share, conversation: Conversation) -> int:
    """Copy the snapshot's files into the new workspace (uploads recorded as uploads);
    returns how many."""
    root = workspace_path(conversation.id)
    copied = 0
    for entry in share.files:
        path = entry.get("path", "")
        opened = share_file_open(share.id, share.snapshot, path)
        if opened is None:
            continue
        source, _ = opened
        size, sha256 = _copy_stream(source, root / PurePosixPath(path)) or (0, "")
        copied += 1
        if entry.get("upload"):
            ConversationFile.objects.create(
                conversation=conversation,
                name=path,
                size=size,
                sha256=sha256,
                content_type=content_type_for(path),
            )
    return copied


def share_fork(*, user: User, share_id: UUID | str) -> Conversation:
    """Start ``user``'s own conversation from a share they may see: the snapshot's
    transcript (runs, events, decided approvals) as its history and the agent's memory,
    its files copied into the new workspace, and of the shared conversation's
    datasources only those ``user`` may use (:func:`datasources_usable`); no model choice
    is copied (the person's own default applies). A notice at its end says where it came
    from. Raises ``NotFound`` (404) as :func:`~conversations.selectors.shares.share_for_viewer`."""
    share = share_for_viewer(user=user, share_id=share_id)
    source = share.conversation
    slugs = list(source.datasources)
    for run in share.runs.values_list("datasources", flat=True):
        slugs += [slug for slug in run or [] if isinstance(slug, str)]
    usable = set(datasources_usable(user=user, slugs=slugs))
    with transaction.atomic():
        conversation = conversation_create(
            user=user,
            title=_fork_title(share.title),
            datasources=[slug for slug in source.datasources if slug in usable],
        )
        workspace_ensure(conversation.id)
        try:
            run_map = _fork_runs(share, conversation, user, usable)
            _fork_approvals(share, conversation, run_map)
            cursor = _fork_events(share, conversation, run_map)
            files = _fork_files(share, conversation)
            dropped = sorted(set(slugs) - usable)  # the conversation's and its runs'

            message = (
                f"Forked from {source.user.get_username()}'s shared conversation "
                f"(as it was on {share.snapshot_at:%Y-%m-%d %H:%M} UTC): the agent remembers "
                f"its {len(run_map)} turn(s); {files} file(s) copied."
            )
            if dropped:
                message += f" Left out, as you may not use them: {', '.join(dropped)}."
            payload = {"type": "notice", "level": "info", "code": "forked", "message": message}
            events_store(
                events={
                    conversation.id: [StoredEvent(cursor + 1, None, "notice", "forked", payload)]
                }
            )
        except BaseException:
            workspace_remove(conversation.id)
            raise
    conversation.refresh_from_db()
    return conversation
