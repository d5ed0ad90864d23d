"""Helpers shared by tests: free ports, child processes that never outlive a test, and
waiting for an HTTP endpoint."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from email.message import Message
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

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


def private_redis_url() -> str:
    """Another database on the session's Redis server (its number with the lowest bit
    flipped: 15 gives 14), emptied here: for processes that must not share the suite's
    queues. (A separate worker on the suite's Redis consumes the shared ``runs`` queue,
    so the session's own worker node could take its runs.)"""
    import redis

    parts = urlsplit(os.environ["PAW_REDIS_URL"])
    number = int(parts.path.strip("/") or 0) ^ 1
    url = urlunsplit(parts._replace(path=f"/{number}"))
    redis.Redis.from_url(url).flushdb()
    return url


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
    on a full pipe.

    The child gets SIGTERM when this test session dies (``setpriv --pdeathsig``, Linux's
    parent-death signal; the command is executed in place, same pid): a session killed
    before its clean-up would otherwise leave, say, a worker node consuming its Redis
    queues, which takes the runs of the next session on the same database number."""
    setpriv = shutil.which("setpriv")  # by its full path: ``env`` may set another PATH
    if setpriv:
        command = [setpriv, "--pdeathsig", "TERM", "--", *command]
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


def web_process(port: int, **env: str) -> contextlib.AbstractContextManager[subprocess.Popen]:
    """The web process on ``127.0.0.1:port`` (``python -m paw_project.web``, as ``runpaw``
    starts it in Redis mode), with ``env`` added to its environment; a
    :func:`child_process`."""
    command = [PYTHON, "-m", "paw_project.web", "--host", "127.0.0.1", "--port", str(port)]
    return child_process(command, env=env)


def output_of(process: subprocess.Popen) -> str:
    """Everything a :func:`child_process` printed so far."""
    return process.log_path.read_text(errors="replace")


def http_get(
    url: str, timeout: float = 5.0, headers: dict[str, str] | None = None
) -> tuple[int, bytes, Message]:
    """``(status, body, headers)`` of a GET (with the given request ``headers``), for any
    status; the response headers are looked up in any case (the server sends them in
    lower case)."""
    request = urllib.request.Request(url, headers=headers or {})  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        return error.code, error.read(), error.headers


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
