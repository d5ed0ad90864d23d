"""Helpers shared by tests: free ports, child processes that never outlive a test, and
waiting for an HTTP endpoint."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def database_settings() -> dict:
    """``{host, port, database, user}`` of the database pytest-django created (``test_`` +
    the configured name): a PostgreSQL datasource's connection settings, say."""
    from django.db import connection

    settings = connection.settings_dict
    return {
        "host": settings["HOST"] or "127.0.0.1",
        "port": int(settings["PORT"] or 5432),
        "database": settings["NAME"],
        "user": settings["USER"] or "postgres",
    }


def worker_database_url() -> str:
    """The URL of the database pytest-django created (``test_`` + the configured name)."""
    db = database_settings()
    return f"postgres://{db['user']}@{db['host']}:{db['port']}/{db['database']}"


@contextlib.contextmanager
def child_process(
    command: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
    stop_signal: int = signal.SIGTERM,
    grace: float = 15.0,
) -> Iterator[subprocess.Popen]:
    """Run ``command`` in its own process group; on exit send ``stop_signal``, then SIGKILL
    the whole group after ``grace`` seconds. Its stdout and stderr go to a log file
    (``process.log_path``; read it with :func:`output_of`), so a chatty child never blocks
    on a full pipe."""
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed below
        prefix="child-", suffix=".log", dir=os.environ.get("PAW_VAR_DIR"), delete=False
    )
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    process.log_path = Path(log.name)
    log.close()
    try:
        yield process
    finally:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, stop_signal)
            try:
                process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)  # anything the child left behind


def output_of(process: subprocess.Popen) -> str:
    """Everything a :func:`child_process` printed so far."""
    return process.log_path.read_text(errors="replace")


def http_get(
    url: str, timeout: float = 5.0, headers: dict[str, str] | None = None
) -> tuple[int, bytes, dict[str, str]]:
    """``(status, body, headers)`` of a GET (with the given request ``headers``), for any
    status."""
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return response.status, response.read(), dict(response.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def wait_http(url: str, *, process: subprocess.Popen | None = None, timeout: float = 60.0) -> None:
    """Wait until ``url`` answers any HTTP status; fail early if ``process`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"process exited with {process.returncode}:\n{output_of(process)}")
        try:
            http_get(url, timeout=2)
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {timeout} s")
