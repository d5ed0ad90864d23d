"""npm packages the tests use (the single sign-on tests' OpenID provider, axe-core), each
pinned by a ``package.json`` and ``package-lock.json`` in a source folder of the tests and
installed once per version of its lock file (``npm ci``) into
``$XDG_CACHE_HOME/paw-tests/`` (else ``~/.cache/paw-tests/``), reused by later runs and
other checkouts."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

NPM_TIMEOUT = 300  # s for one ``npm ci``


def npm_folder(source: Path, name: str) -> Path:
    """Where the packages of ``source`` (a folder with ``package-lock.json``) are
    installed: ``<cache>/<name>-<first 16 hex digits of the lock file's SHA-256>``."""
    lock = (source / "package-lock.json").read_bytes()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "paw-tests" / f"{name}-{hashlib.sha256(lock).hexdigest()[:16]}"


def npm_install(source: Path, folder: Path, *, what: str) -> None:
    """``npm ci`` of ``source``'s package files into ``folder``: each session installs
    into a staging folder of its own and renames it into place, so concurrent sessions
    never see a half-made install (the first to finish is kept). Fails the test, naming
    ``what``, when the install fails."""
    staging = folder.with_name(f"{folder.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in ("package.json", "package-lock.json"):
        shutil.copy(source / name, staging / name)
    result = subprocess.run(
        ["npm", "ci", "--omit=dev", "--no-audit", "--no-fund", "--ignore-scripts"],
        cwd=staging, capture_output=True, text=True, timeout=NPM_TIMEOUT, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        pytest.fail(f"npm ci of {what} failed:\n{result.stdout}{result.stderr}")
    try:
        staging.rename(folder)
    except OSError:  # another session was first: use its copy
        shutil.rmtree(staging, ignore_errors=True)
