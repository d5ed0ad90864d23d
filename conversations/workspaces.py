"""Where a conversation's files live on disk.

Each conversation has a workspace folder ``<PAW_WORKSPACE_ROOT>/<conversation id>/``: the
sandbox's working directory, where uploads land and the agent writes its artifacts.
Folders whose name starts with a dot (``.paw/`` holds the sandbox's private HOME, TMPDIR
and installed packages) are private to the runtime and never listed as artifacts.
"""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from django.conf import settings

PRIVATE_DIR = ".paw"


def workspace_path(conversation_id: UUID | str) -> Path:
    """The workspace folder of a conversation (not created; see :func:`workspace_ensure`)."""
    return Path(settings.PAW_WORKSPACE_ROOT) / str(UUID(str(conversation_id)))


def workspace_ensure(conversation_id: UUID | str) -> Path:
    """The workspace folder of a conversation, created (mode 0700) if missing."""
    path = workspace_path(conversation_id)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    return path


def private_path(conversation_id: UUID | str) -> Path:
    """The runtime's private folder inside the workspace (HOME, TMPDIR, packages)."""
    return workspace_path(conversation_id) / PRIVATE_DIR
