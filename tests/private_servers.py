"""Private, throwaway database and cache servers for a test session on a machine where
none is running.

:func:`start_postgres`, :func:`start_redis` and :func:`start_mariadb` each make a new
server in a temporary folder of its own, listening on a free port of 127.0.0.1 only
(no Unix socket, no durability: it lives for one session), and return it running; its
:meth:`PrivateServer.stop` stops it and removes the folder. The binaries are Debian's:
PostgreSQL's from ``/usr/lib/postgresql/<version>/bin`` (newest first) or ``PATH``,
``redis-server``, and ``mariadb-install-db`` / ``mariadbd``. A missing one raises
:class:`ServerUnavailable` naming the Debian package that brings it.

PostgreSQL and MariaDB refuse to run as root: as root, their servers run as the system
user their Debian packages create (``postgres``, ``mysql``; else ``nobody``), which
owns the folder. Every server is told to die with the process that started it
(``PR_SET_PDEATHSIG``), so a test session that is killed leaves no server running.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

#: Seconds a new server has to accept connections.
START_TIMEOUT = 60.0
#: Seconds a server has to stop before it is killed.
STOP_TIMEOUT = 20.0
POSTGRES_BIN_GLOB = "/usr/lib/postgresql/*/bin"
_PR_SET_PDEATHSIG = 1


class ServerUnavailable(RuntimeError):
    """A private server cannot be started (a binary is missing, or it failed to start);
    the message says why and what to install."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def listening(host: str, port: int, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections on ``host:port`` right now."""
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def find_binary(
    name: str, *, package: str, search: Iterable[str] = (), path: str | None = None
) -> str:
    """The path of the executable ``name``: the first folder of ``search`` holding it,
    else the first on ``path`` (default: ``PATH``, then ``/usr/sbin`` and ``/sbin``,
    where Debian puts daemons). Raises :class:`ServerUnavailable` naming the Debian
    ``package`` when there is none."""
    for folder in search:
        candidate = Path(folder) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    if path is None:
        path = f"{os.environ.get('PATH', os.defpath)}:/usr/sbin:/sbin"
    found = shutil.which(name, path=path)
    if found:
        return found
    raise ServerUnavailable(
        f"{name} was not found: install Debian's {package} (apt-get install {package})."
    )


def postgres_bin_dirs() -> list[str]:
    """Debian's PostgreSQL binary folders, newest major version first."""

    def version(folder: str) -> tuple[int, ...]:
        part = Path(folder).parent.name
        return tuple(int(p) for p in part.split(".") if p.isdigit())

    return sorted(glob.glob(POSTGRES_BIN_GLOB), key=version, reverse=True)


def _service_user(preferred: str) -> pwd.struct_passwd | None:
    """The unprivileged user a database server runs as when we are root (``None`` when
    we are not root: it runs as us)."""
    if os.geteuid() != 0:
        return None
    for name in (preferred, "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise ServerUnavailable(
        f"running as root, and there is no {preferred} or nobody user to run as"
    )


def _die_with_parent() -> None:
    """In the child, after its user was changed (which clears the setting): get SIGTERM
    when the process that started the server dies."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class PrivateServer:
    """A running private server: ``kind`` (``postgresql``, ``redis``, ``mariadb``),
    ``port`` on 127.0.0.1, its ``folder`` (data and log), its ``process``."""

    kind: str
    port: int
    folder: Path
    process: subprocess.Popen
    stop_signal: int = signal.SIGTERM
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.folder / "server.log"

    def log(self) -> str:
        """The end of what the server wrote."""
        try:
            return self.log_path.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def stop(self) -> None:
        """Stop the server (its ``stop_signal``, then SIGKILL after ``STOP_TIMEOUT``)
        and remove its folder. Idempotent."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(self.stop_signal)
            try:
                self.process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


def _folder(kind: str, owner: pwd.struct_passwd | None) -> Path:
    folder = Path(tempfile.mkdtemp(prefix=f"paw-test-{kind}-"))
    if owner is not None:
        os.chown(folder, owner.pw_uid, owner.pw_gid)
    return folder


def _as(owner: pwd.struct_passwd | None) -> dict:
    """``subprocess`` arguments running a child as ``owner`` (nothing when ``None``)."""
    if owner is None:
        return {}
    return {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}


def _launch(
    kind: str,
    command: list[str],
    *,
    folder: Path,
    port: int,
    owner: pwd.struct_passwd | None,
    ready: Callable[[], bool],
    stop_signal: int,
) -> PrivateServer:
    """Start ``command`` and wait until ``ready()``; on failure stop it and raise
    :class:`ServerUnavailable` with the end of its log."""
    log = open(folder / "server.log", "wb")  # noqa: SIM115 - the child keeps it
    try:
        process = subprocess.Popen(
            command,
            cwd=folder,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            # A prctl call only (async-signal-safe enough); MariaDB may start mid-session.
            preexec_fn=_die_with_parent,
            **_as(owner),
        )
    finally:
        log.close()
    server = PrivateServer(kind, port, folder, process, stop_signal)
    deadline = time.monotonic() + START_TIMEOUT
    while not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            output = server.log()
            server.stop()
            raise ServerUnavailable(f"the private {kind} server did not start:\n{output}")
        time.sleep(0.1)
    return server


def _run(command: list[str], *, folder: Path, owner: pwd.struct_passwd | None, what: str) -> None:
    result = subprocess.run(
        command, cwd=folder, capture_output=True, text=True, timeout=120, check=False, **_as(owner)
    )
    if result.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise ServerUnavailable(
            f"{what} failed ({result.returncode}):\n{result.stdout}{result.stderr}"
        )


def start_postgres(*, user: str = "postgres") -> PrivateServer:
    """A new PostgreSQL cluster (``initdb``, trust authentication, superuser ``user``)
    served on a free port of 127.0.0.1. Tuned for a throwaway: no fsync, room for the
    connection pools of the suite's several processes."""
    search = postgres_bin_dirs()
    initdb = find_binary("initdb", package="postgresql", search=search)
    postgres = find_binary("postgres", package="postgresql", search=search)
    owner = _service_user("postgres")
    folder = _folder("postgresql", owner)
    data = folder / "data"
    _run(
        [initdb, "-D", str(data), "-U", user, "--auth=trust", "--no-sync",
         "--encoding=UTF8", "--locale=C.UTF-8"],
        folder=folder, owner=owner, what="initdb",
    )  # fmt: skip
    port = free_port()
    command = [
        postgres, "-D", str(data), "-p", str(port), "-h", "127.0.0.1", "-k", "",
        "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
        "-c", "max_connections=300",
    ]  # fmt: skip

    def ready() -> bool:
        import psycopg

        try:
            psycopg.connect(
                host="127.0.0.1", port=port, user=user, dbname="postgres", connect_timeout=2
            ).close()
        except psycopg.Error:
            return False
        return True

    # SIGINT is PostgreSQL's fast shutdown: it ends open sessions instead of waiting.
    return _launch(
        "postgresql", command, folder=folder, port=port, owner=owner, ready=ready,
        stop_signal=signal.SIGINT,
    )  # fmt: skip


def start_redis() -> PrivateServer:
    """A new Redis server on a free port of 127.0.0.1, in memory only."""
    redis_server = find_binary("redis-server", package="redis-server")
    folder = _folder("redis", None)
    port = free_port()
    command = [
        redis_server, "--port", str(port), "--bind", "127.0.0.1", "--unixsocket", "",
        "--save", "", "--appendonly", "no", "--dir", str(folder), "--daemonize", "no",
    ]  # fmt: skip

    def ready() -> bool:
        import redis

        try:
            return bool(redis.Redis(host="127.0.0.1", port=port, socket_timeout=2).ping())
        except redis.RedisError:
            return False

    return _launch(
        "redis", command, folder=folder, port=port, owner=None, ready=ready,
        stop_signal=signal.SIGTERM,
    )  # fmt: skip


def start_mariadb(*, database: str) -> PrivateServer:
    """A new MariaDB server (``mariadb-install-db``; ``root`` without a password) on a
    free port of 127.0.0.1, with the empty database ``database`` made."""
    install_db = find_binary("mariadb-install-db", package="mariadb-server")
    mariadbd = find_binary("mariadbd", package="mariadb-server")
    owner = _service_user("mysql")
    folder = _folder("mariadb", owner)
    data = folder / "data"
    _run(
        [install_db, "--no-defaults", f"--datadir={data}", "--auth-root-authentication-method=normal",
         "--skip-test-db"],
        folder=folder, owner=owner, what="mariadb-install-db",
    )  # fmt: skip
    port = free_port()
    command = [
        mariadbd, "--no-defaults", f"--datadir={data}", f"--port={port}",
        "--bind-address=127.0.0.1", f"--socket={folder / 'mariadb.sock'}",
        f"--pid-file={folder / 'mariadb.pid'}", "--skip-log-bin", "--innodb-flush-log-at-trx-commit=0",
    ]  # fmt: skip

    def ready() -> bool:
        import pymysql

        try:
            conn = pymysql.connect(host="127.0.0.1", port=port, user="root", connect_timeout=2)
        except pymysql.Error:
            return False
        with conn, conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{database}`")
        return True

    return _launch(
        "mariadb", command, folder=folder, port=port, owner=owner, ready=ready,
        stop_signal=signal.SIGTERM,
    )  # fmt: skip
