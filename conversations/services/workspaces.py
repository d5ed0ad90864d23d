"""Creating and removing conversation workspaces (the folders themselves:
:mod:`conversations.selectors.workspaces`)."""

from __future__ import annotations

import shutil
from pathlib import Path
from uuid import UUID

from conversations.selectors.workspaces import workspace_path


def workspace_ensure(conversation_id: UUID | str) -> Path:
    """The workspace folder of a conversation, created (mode 0700) if missing."""
    path = workspace_path(conversation_id)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def workspace_remove(conversation_id: UUID | str) -> None:
    """Remove a conversation's workspace folder with everything in it (no error when it is
    already gone)."""
    shutil.rmtree(workspace_path(conversation_id), ignore_errors=True)
