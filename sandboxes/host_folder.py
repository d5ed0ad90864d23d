"""The sandbox's host folder (``.paw/host`` in its workspace): the files only PAW writes
there (knowledge indexes, the runtime's config), which the jail binds read-only. Every
write goes through a descriptor opened one folder at a time with ``O_NOFOLLOW``: the
workspace is the agent's, and a link it left must never lead PAW's writes outside.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import uuid
from pathlib import Path

from conversations.selectors.workspaces import PRIVATE_DIR
from secrets_vault.services import RunKnowledge, knowledge_index_write

#: The sandbox's folder only PAW writes (``.paw/host``): bound read-only into the jail.
HOST_DIR = "host"
#: Where, under ``.paw/host``, a run's knowledge index files go (relative to the workspace).
KNOWLEDGE_FOLDER = f"{PRIVATE_DIR}/{HOST_DIR}/knowledge"


def _host_folder(workspace: Path, parts: tuple[str, ...]) -> int:
    """A descriptor of ``workspace/.paw/host/<parts>``, opened one folder at a time with
    ``O_NOFOLLOW`` (the workspace is the agent's: a link it left must not lead PAW's
    writes outside). Raises ``OSError``; the caller closes it."""
    fd = os.open(workspace, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in (PRIVATE_DIR, HOST_DIR, *parts):
            child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def host_file_put(workspace: Path, parts: tuple[str, ...], name: str, source: Path | bytes) -> None:
    """Put a file PAW made (``source``: its bytes, or a file of PAW's own to copy) into the
    sandbox's read-only ``.paw/host/<parts>/<name>``: written under a temporary name,
    then renamed over ``name`` (a reader never sees half a file, and a link standing there
    is replaced, never followed). Raises ``OSError``."""
    fd = _host_folder(workspace, parts)
    temporary = f".put-{uuid.uuid4().hex}"
    try:
        out = os.open(
            temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o444, dir_fd=fd
        )
        with os.fdopen(out, "wb") as target:
            if isinstance(source, bytes):
                target.write(source)
            else:
                with open(source, "rb") as origin:
                    shutil.copyfileobj(origin, target, 1 << 20)
        os.replace(temporary, name, src_dir_fd=fd, dst_dir_fd=fd)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary, dir_fd=fd)
        raise
    finally:
        os.close(fd)


def host_files(workspace: Path, parts: tuple[str, ...]) -> list[str]:
    """The regular files (not links) in the sandbox's ``.paw/host/<parts>``."""
    fd = _host_folder(workspace, parts)
    try:
        return sorted(
            name
            for name in os.listdir(fd)
            if stat.S_ISREG(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode)
        )
    finally:
        os.close(fd)


def host_file_remove(workspace: Path, parts: tuple[str, ...], name: str) -> None:
    """Remove ``name`` from the sandbox's ``.paw/host/<parts>`` (gone already: fine)."""
    fd = _host_folder(workspace, parts)
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=fd)
    finally:
        os.close(fd)


def knowledge_indexes_place(workspace: Path, knowledge: RunKnowledge) -> list[dict[str, str]]:
    """Make sure the sandbox's ``.paw/host/knowledge/`` holds the index file of each of the
    run's datasources at its current version (built in a private temporary folder by
    ``knowledge_index_write``, then put there by :func:`host_file_put`,
    never through a link); older versions go, and so do the index files of datasources
    this run is not given (an earlier run's, one its person may no longer use): the
    sandbox holds the knowledge of its run's datasources only. Returns the submit's
    ``indexes``: ``[{"datasource", "path"}]``, paths relative to the workspace. Raises
    ``OSError`` or ``sqlite3.Error`` when a file cannot be written."""
    folder = ("knowledge",)
    present = set(host_files(workspace, folder))
    wanted = {source.file_name for source in knowledge.sources}
    for name in sorted(present - wanted):
        host_file_remove(workspace, folder, name)
    present &= wanted
    indexes = []
    for source in knowledge.sources:
        if source.file_name not in present:
            with tempfile.TemporaryDirectory(prefix="paw-index-") as scratch:
                built = Path(scratch) / source.file_name
                knowledge_index_write(
                    source=source, path=built, vector_model=knowledge.vector_model
                )
                host_file_put(workspace, folder, source.file_name, built)
        indexes.append(
            {"datasource": source.slug, "path": f"{KNOWLEDGE_FOLDER}/{source.file_name}"}
        )
    return indexes
