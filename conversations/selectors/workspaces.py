"""Where a conversation's files live on disk, and reading them (creating and removing
workspaces: :mod:`conversations.services.workspaces`).

Each conversation has a workspace folder ``<PAW_WORKSPACE_ROOT>/<conversation id>/``: the
sandbox's working directory, where uploads land and the agent writes its artifacts.
Folders whose name starts with a dot (``.paw/`` holds the sandbox's private HOME, TMPDIR
and installed packages) are private to the runtime and never listed as artifacts.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from typing import BinaryIO
from uuid import UUID

from django.conf import settings

PRIVATE_DIR = ".paw"
#: The folder, under ``PAW_WORKSPACE_ROOT``, of the shares' snapshots (one folder per share,
#: one per snapshot in it); a dot-name, so no conversation id can clash with it.
SHARES_DIR = ".shares"


def workspace_path(conversation_id: UUID | str) -> Path:
    """The workspace folder of a conversation (not created; see
    :func:`conversations.services.workspaces.workspace_ensure`)."""
    return Path(settings.PAW_WORKSPACE_ROOT) / str(UUID(str(conversation_id)))


def private_path(conversation_id: UUID | str) -> Path:
    """The runtime's private folder inside the workspace (HOME, TMPDIR, packages)."""
    return workspace_path(conversation_id) / PRIVATE_DIR


def _unservable(name: str) -> bool:
    """A name no download URL can carry: a backslash (read as a separator elsewhere), or a
    control character (a newline, a NUL)."""
    return "\\" in name or any(ord(char) < 0x20 or ord(char) == 0x7F for char in name)


def _is_private(parts: tuple[str, ...]) -> bool:
    """A path is private to the runtime when any of its parts starts with a dot."""
    return any(part.startswith(".") for part in parts)


def workspace_relative(conversation_id: UUID | str, relative_path: str) -> PurePosixPath | None:
    """The normalised location of ``relative_path`` inside the workspace, or ``None`` when it
    must not be served: empty, absolute, with ``..``/backslashes/NUL, private (a part
    starting with a dot), missing, or resolving (through symlinks) outside the workspace
    or into a private part. Symlinks that stay inside resolve to their target."""
    if not relative_path or _unservable(relative_path):
        return None
    candidate = PurePosixPath(relative_path)
    if candidate.is_absolute() or ".." in candidate.parts or _is_private(candidate.parts):
        return None
    root = os.path.realpath(workspace_path(conversation_id))
    resolved = os.path.realpath(os.path.join(root, *candidate.parts))
    if os.path.commonpath([root, resolved]) != root or resolved == root:
        return None
    inside = PurePosixPath(os.path.relpath(resolved, root))
    return None if _is_private(inside.parts) else inside


def workspace_open(conversation_id: UUID | str, relative_path: str) -> tuple[BinaryIO, int] | None:
    """Open a regular file of the workspace for reading: ``(file, size in bytes)``, or
    ``None`` when :func:`workspace_relative` refuses the path or it is not a regular file.

    The file is opened one folder at a time from the workspace with ``O_NOFOLLOW``, so a
    symlink swapped in after the check (the runtime is untrusted) cannot lead outside.
    """
    inside = workspace_relative(conversation_id, relative_path)
    if inside is None:
        return None
    return _open_inside(workspace_path(conversation_id), inside)


def _open_inside(root: Path, inside: PurePosixPath) -> tuple[BinaryIO, int] | None:
    """Open the regular file ``inside`` (relative, already checked) of the folder
    ``root`` one folder at a time with ``O_NOFOLLOW``: ``(file, size in bytes)``, or
    ``None`` when a part is missing, a symlink, or not a regular file."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        folder = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        for part in inside.parts[:-1]:
            child = os.open(part, flags | os.O_DIRECTORY, dir_fd=folder)
            os.close(folder)
            folder = child
        fd = os.open(inside.parts[-1], flags | os.O_NONBLOCK, dir_fd=folder)
    except OSError:
        return None
    finally:
        os.close(folder)
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        return None
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb"), info.st_size


@dataclass(frozen=True)
class WorkspaceEntry:
    """A file found in a workspace: ``path`` relative to it (``/``-separated), ``size`` in
    bytes, ``modified`` (aware UTC datetime)."""

    path: str
    size: int
    modified: datetime


def workspace_files(conversation_id: UUID | str) -> list[WorkspaceEntry]:
    """Every non-private regular file of the workspace, recursively, sorted by path.

    Private parts (names starting with a dot) are skipped and not descended into, and so
    are names that cannot be downloaded (a backslash or a control character); symlinks
    are listed only when they point at a regular file inside the workspace and outside the
    private parts, and symlinked folders are not descended into. A missing workspace has no
    files.
    """
    root = workspace_path(conversation_id)
    entries: list[WorkspaceEntry] = []
    for folder, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = [n for n in dirnames if not n.startswith(".") and not _unservable(n)]
        for name in filenames:
            if name.startswith(".") or _unservable(name):
                continue
            full = os.path.join(folder, name)
            relative = PurePosixPath(os.path.relpath(full, root)).as_posix()
            if os.path.islink(full) and workspace_relative(conversation_id, relative) is None:
                continue
            try:
                info = os.stat(full)
            except OSError:  # vanished meanwhile, or a dangling link
                continue
            if not stat.S_ISREG(info.st_mode):
                continue
            modified = datetime.fromtimestamp(info.st_mtime, tz=UTC)
            entries.append(WorkspaceEntry(path=relative, size=info.st_size, modified=modified))
    entries.sort(key=lambda entry: entry.path)
    return entries


def share_root(share_id: UUID | str) -> Path:
    """The folder of a share's snapshots: ``<PAW_WORKSPACE_ROOT>/.shares/<share id>/``."""
    return Path(settings.PAW_WORKSPACE_ROOT) / SHARES_DIR / str(UUID(str(share_id)))


def share_folder(share_id: UUID | str, snapshot: int) -> Path:
    """The folder of one snapshot of a share, holding copies of the conversation's files
    at their workspace paths (written by PAW only: no sandbox sees it)."""
    return share_root(share_id) / str(int(snapshot))


def share_file_open(
    share_id: UUID | str, snapshot: int, relative_path: str
) -> tuple[BinaryIO, int] | None:
    """Open the copy of ``relative_path`` in a share's snapshot: ``(file, size in
    bytes)``, or ``None`` when the path is not one a snapshot can hold (as
    :func:`workspace_relative` refuses it: absolute, ``..``, private) or the file is
    missing. The caller checks that the snapshot lists the path."""
    if not relative_path or _unservable(relative_path):
        return None
    candidate = PurePosixPath(relative_path)
    if candidate.is_absolute() or ".." in candidate.parts or _is_private(candidate.parts):
        return None
    return _open_inside(share_folder(share_id, snapshot), candidate)
