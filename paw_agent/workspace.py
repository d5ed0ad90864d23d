"""Workspace confinement: every path a tool touches stays inside the workspace.

A path is refused when it is absolute, contains a ``..`` part, or resolves (through
symlinks) to somewhere outside the workspace (PAW's security rules, DESIGN.md). The real
boundary is the sandbox (bubblewrap); this check gives the model a clear error instead of a
confusing permission failure, and protects hosts that run without a sandbox.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

# Runtime-private files (installed packages) live here, hidden from list_files.
PRIVATE_DIR = ".paw"


class PathRefused(ValueError):
    """A tool path outside the workspace; the message is written for the model."""


class Workspace:
    """The workspace root (``--project DIR``), resolved once at start.

    Raises ``FileNotFoundError`` when ``root`` is not a directory.
    """

    def __init__(self, root: str | os.PathLike[str]) -> None:
        real = Path(os.path.realpath(root))
        if not real.is_dir():
            raise FileNotFoundError(f"workspace {root} is not a directory")
        self.root = real

    def resolve(self, path: str) -> Path:
        """The absolute path of ``path`` (relative to the workspace; ``""`` or ``.`` is the
        root), after refusing absolute paths, ``..`` parts and symlink escapes.

        Raises :class:`PathRefused` with a message naming the rule broken.
        """
        if not isinstance(path, str):
            raise PathRefused("path must be a string relative to the workspace")
        if "\x00" in path:
            raise PathRefused("path contains a NUL character")
        text = path.strip() or "."
        if text.startswith(("/", "\\", "~")) or PurePosixPath(text).is_absolute():
            raise PathRefused(
                f"refused {path!r}: absolute paths are not allowed; "
                "use a path relative to the workspace"
            )
        if ".." in PurePosixPath(text.replace("\\", "/")).parts:
            raise PathRefused(f"refused {path!r}: '..' is not allowed in paths")
        candidate = self.root / text
        real = Path(os.path.realpath(candidate))
        if real != self.root and self.root not in real.parents:
            raise PathRefused(
                f"refused {path!r}: it resolves through a symlink to {real}, outside the workspace"
            )
        return candidate

    def relative(self, path: Path) -> str:
        """``path`` (inside the workspace) as the workspace-relative string the model uses."""
        try:
            rel = Path(path).relative_to(self.root)
        except ValueError:
            rel = Path(os.path.realpath(path)).relative_to(self.root)
        return rel.as_posix() if str(rel) != "." else "."
