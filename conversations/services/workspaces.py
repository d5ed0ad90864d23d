"""Creating and removing conversation workspaces (the folders themselves:
:mod:`conversations.selectors.workspaces`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from uuid import UUID

from conversations.selectors.workspaces import share_folder, share_root, workspace_path


def workspace_ensure(conversation_id: UUID | str) -> Path:
    """The workspace folder of a conversation, created (mode 0700) if missing."""
    path = workspace_path(conversation_id)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def workspace_remove(conversation_id: UUID | str) -> None:
    """Remove a conversation's workspace folder with everything in it (no error when it is
    already gone)."""
    shutil.rmtree(workspace_path(conversation_id), ignore_errors=True)


def workspace_adopt(conversation_id: UUID | str, folder: Path) -> bool:
    """Make ``folder`` the conversation's workspace, when the conversation has none yet or
    an empty one: ``folder`` (a spare sandbox's, on the workspaces' file system) is
    renamed into place in one step, replacing the empty folder, so a file that lands
    meanwhile (an upload) either made the workspace non-empty first or lands in
    ``folder``'s new place. Returns ``False``, changing nothing, when the workspace holds
    anything (an upload came first, an earlier sandbox's files) or ``folder`` is gone."""
    try:
        os.rename(folder, workspace_path(conversation_id))
    except OSError:  # ENOTEMPTY / EEXIST: not empty; ENOENT: no folder; ENOTDIR
        return False
    return True


def share_folder_remove(share_id: UUID | str, snapshot: int | None = None) -> None:
    """Remove one snapshot's folder of a share, or (``snapshot`` ``None``) every folder
    of the share (no error when already gone)."""
    folder = share_root(share_id) if snapshot is None else share_folder(share_id, snapshot)
    shutil.rmtree(folder, ignore_errors=True)
