"""Fixtures for the runtime tests: a scripted model per test, a workspace, and a factory
that starts a real runtime process against them."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from scripted_model import ScriptedModel
from tests.paw_agent.driver import Runtime, runtime_command, spawned

API_KEY = "sk-runtime-test"


@pytest.fixture
def model() -> Iterator[ScriptedModel]:
    """A scripted model server; tests load their script with ``model.load(...)``."""
    with ScriptedModel({"api_key": API_KEY}) as server:
        yield server


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """An empty workspace folder (the runtime's ``--project``)."""
    path = tmp_path / "workspace"
    path.mkdir()
    return path


def runtime_env(
    base: Path, model: ScriptedModel, marker: str, extra: dict[str, str] | None = None
) -> dict[str, str]:
    """A minimal environment built from scratch, as PAW's host does: own HOME, XDG_* and
    TMPDIR, loopback without proxy, the model settings, and a marker variable that lets a
    test find every process the runtime started."""
    home = base / "home"
    dirs = {
        "HOME": home,
        "XDG_DATA_HOME": home / "data",
        "XDG_CONFIG_HOME": home / "config",
        "XDG_CACHE_HOME": home / "cache",
        "XDG_STATE_HOME": home / "state",
        "TMPDIR": base / "tmp",
    }
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    env = {name: str(path) for name, path in dirs.items()}
    env.update(
        {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "OPENAI_BASE_URL": model.base_url,
            "OPENAI_API_KEY": API_KEY,
            "OPENAI_MODEL": "scripted-model",
            "PAW_TEST_MARKER": marker,
        }
    )
    # pip's local mirrors (install_package) are configured through PIP_* variables here.
    env.update({k: v for k, v in os.environ.items() if k.startswith("PIP_")})
    env.update(extra or {})
    return env


@pytest.fixture
def start(
    tmp_path: Path, model: ScriptedModel, workspace: Path
) -> Iterator[Callable[..., Runtime]]:
    """``start(kind="paw-agent", *flags, env={...})`` spawns a runtime in ``workspace``
    against ``model`` and waits for nothing; every process is killed at the end."""
    stack: list = []

    def factory(
        kind: str = "paw-agent",
        *flags: str,
        env: dict[str, str] | None = None,
        project: Path | None = None,
    ) -> Runtime:
        marker = f"paw-test-{uuid.uuid4().hex}"
        base = tmp_path / f"env-{len(stack)}"
        context = spawned(
            runtime_command(kind, project or workspace, *flags),
            runtime_env(base, model, marker, env),
            cwd=workspace,
        )
        runtime = context.__enter__()
        runtime.marker = marker
        stack.append(context)
        return runtime

    yield factory
    for context in reversed(stack):
        context.__exit__(None, None, None)
