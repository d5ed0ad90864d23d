"""The test environment, loaded as a pytest plugin (``-p tests.pawenv``) before Django
reads its settings.

Tests run against real services: PostgreSQL (``PAW_TEST_DATABASE_URL``, default
``postgres://postgres@127.0.0.1:5432/paw_test``; pytest-django creates ``test_<name>``)
and Redis (``PAW_TEST_REDIS_URL``, default ``redis://127.0.0.1:6379/15``, flushed at the
start of the session); the MariaDB datasource tests use ``PAW_TEST_MARIADB_URL``
(default ``mysql://root@127.0.0.1:3306/test``) through the ``mariadb_url`` fixture.

When nothing listens at a configured loopback URL, the session starts a private,
throwaway server of that kind itself (:mod:`tests.private_servers`: PostgreSQL and Redis
at once, MariaDB when a test first asks for it), runs against it and removes it at the
end. ``PAW_TEST_PRIVATE_SERVERS`` says when: ``auto`` (the default) as just said, ``1``
always (even when servers answer), ``0`` never. A server that cannot be reached and
cannot be started stops the session at once, saying how to start it or what to install;
a missing MariaDB skips its tests, saying so. Files go to a temporary folder removed at
the end.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from tests import private_servers
from tests.private_servers import PrivateServer, ServerUnavailable

_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", None)
PRIVATE_MODE = os.environ.get("PAW_TEST_PRIVATE_SERVERS", "auto").strip().lower()
if PRIVATE_MODE not in ("auto", "1", "0"):
    raise pytest.UsageError(f"PAW_TEST_PRIVATE_SERVERS={PRIVATE_MODE!r}: use auto, 1 or 0.")

#: The private servers this session started (stopped at its end).
PRIVATE: dict[str, PrivateServer] = {}
#: Why a service could neither be reached nor started, by kind (the session stops with these).
_PROBLEMS: dict[str, str] = {}


def _stop_private_servers() -> None:
    for server in list(PRIVATE.values()):
        server.stop()
    PRIVATE.clear()


# Also when the session ends without pytest_unconfigure (an error while it starts).
atexit.register(_stop_private_servers)


def _with_port(url: str, port: int) -> str:
    """``url`` pointing at ``127.0.0.1:port`` (user, password, path and query kept)."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def _wants_private(url: str, default_port: int) -> bool:
    """Whether the session should use a private server instead of the one at ``url``."""
    if PRIVATE_MODE == "0":
        return False
    if PRIVATE_MODE == "1":
        return True
    parts = urlsplit(url)
    return parts.hostname in _LOCAL_HOSTS and not private_servers.listening(
        parts.hostname or "127.0.0.1", parts.port or default_port
    )


def _private_url(kind: str, variable: str, default_port: int, start) -> str:
    """The URL the session uses for the environment ``variable``'s: that one, or a new
    private server's (then ``PRIVATE[kind]`` is that server). A server that cannot start
    is recorded in ``_PROBLEMS`` and the configured URL is kept."""
    url = os.environ[variable]
    if not _wants_private(url, default_port):
        return url
    try:
        server = start()
    except ServerUnavailable as error:
        where = f"{urlsplit(url).hostname}:{urlsplit(url).port or default_port}"
        _PROBLEMS[kind] = (
            f"Nothing answers at {where} for {kind}, and no private server could be started: "
            f"{error}\nOr start one there, or point {variable} at a running server."
        )
        return url
    PRIVATE[kind] = server
    return _with_port(url, server.port)


os.environ.setdefault("PAW_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/paw_test")
os.environ.setdefault("PAW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
TEST_DATABASE_URL = _private_url(
    "PostgreSQL",
    "PAW_TEST_DATABASE_URL",
    5432,
    lambda: private_servers.start_postgres(
        user=urlsplit(os.environ["PAW_TEST_DATABASE_URL"]).username or "postgres"
    ),
)
TEST_REDIS_URL = _private_url("Redis", "PAW_TEST_REDIS_URL", 6379, private_servers.start_redis)

#: The parallel worker this process is (pytest-xdist's ``gw0``, ``gw1``…; ``make test``
#: runs two), or "" for a session on its own. Each worker has a PostgreSQL test database
#: of its own (pytest-django names it ``test_<name>_gw0``), and so a MariaDB database
#: (``tests.mariadb``) and a Redis database: worker N uses the configured number minus
#: 2N, so its queues, channel layer and throttles are its own (and the number with the
#: lowest bit flipped stays free for ``tests.processes.private_redis_url``).
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")


def _worker_redis_url(url: str, worker: str) -> str:
    """``url`` with its database number moved down by twice the worker's index."""
    if not worker:
        return url
    index = int(worker.removeprefix("gw") or 0)
    parts = urlsplit(url)
    number = int(parts.path.strip("/") or 0) - 2 * index
    if number < 0:
        raise pytest.UsageError(
            f"PAW_TEST_REDIS_URL's database {parts.path.strip('/') or 0} leaves no Redis "
            f"database for parallel worker {worker}: use a higher number (15) or fewer workers."
        )
    return urlunsplit(parts._replace(path=f"/{number}"))


TEST_REDIS_URL = _worker_redis_url(TEST_REDIS_URL, XDIST_WORKER)
TEST_MARIADB_URL = os.environ.get("PAW_TEST_MARIADB_URL", "mysql://root@127.0.0.1:3306/test")
TEST_VAR_DIR = tempfile.mkdtemp(prefix="paw-test-")

os.environ.update(
    {
        # Child processes of the tests (and the helpers reading these) use the same servers.
        "PAW_TEST_DATABASE_URL": TEST_DATABASE_URL,
        "PAW_TEST_REDIS_URL": TEST_REDIS_URL,
        "PAW_DATABASE_URL": TEST_DATABASE_URL,
        "PAW_REDIS_URL": TEST_REDIS_URL,
        "PAW_DEBUG": "0",
        "PAW_VAR_DIR": TEST_VAR_DIR,
        "PAW_WORKSPACE_ROOT": os.path.join(TEST_VAR_DIR, "workspaces"),
        "PAW_NODE_NAME": f"test-{os.getpid()}",
        # Full-text retrieval unless a test configures embeddings (the local model of the
        # `embeddings` extra would otherwise be on wherever it is installed).
        "PAW_EMBEDDING_PROVIDER": "",
    }
)
os.environ.setdefault("PAW_SECRET_KEY", "paw-test-secret-key-not-for-production")


_mariadb: dict[str, str] = {}


def mariadb_url() -> str:
    """The MariaDB URL of the session (``PAW_TEST_MARIADB_URL``, or a private server's,
    started on the first call). Skips the calling test, saying why and what to install,
    when nothing answers and no server can be started."""
    if "url" not in _mariadb:
        if "skip" in _mariadb:
            pytest.skip(_mariadb["skip"])
        url = TEST_MARIADB_URL
        parts = urlsplit(url)
        if _wants_private(url, 3306):
            database = parts.path.lstrip("/") or "test"
            try:
                server = private_servers.start_mariadb(database=database)
            except ServerUnavailable as error:
                _mariadb["skip"] = (
                    f"no MariaDB at {parts.hostname}:{parts.port or 3306} "
                    f"(PAW_TEST_MARIADB_URL), and no private one could be started: {error}"
                )
                pytest.skip(_mariadb["skip"])
            PRIVATE["MariaDB"] = server
            url = _with_port(url, server.port)
        elif not private_servers.listening(parts.hostname or "127.0.0.1", parts.port or 3306):
            _mariadb["skip"] = (
                f"no MariaDB answers at {parts.hostname}:{parts.port or 3306} (PAW_TEST_MARIADB_URL)"
            )
            pytest.skip(_mariadb["skip"])
        _mariadb["url"] = url
    return _mariadb["url"]


def _start_postgres_hint(host: str | None, port: int) -> str:
    if host not in _LOCAL_HOSTS:
        return f"Start the PostgreSQL server on {host}:{port}"
    start = "pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start"
    return f"Start it with:  {start}" + (
        f"  (its cluster must listen on port {port})" if port != 5432 else ""
    )


def _start_redis_hint(host: str | None, port: int) -> str:
    if host not in _LOCAL_HOSTS:
        return f"Start the Redis server on {host}:{port}"
    return (
        f"Start it with:  redis-server --daemonize yes --bind {host or '127.0.0.1'} "
        f'--port {port} --save "" --appendonly no'
    )


def _check_postgres() -> str | None:
    import psycopg

    parts = urlsplit(TEST_DATABASE_URL)
    try:
        # pytest-django creates the test database from the server's maintenance database.
        psycopg.connect(
            host=parts.hostname,
            port=parts.port or 5432,
            user=parts.username or "postgres",
            password=parts.password,
            dbname="postgres",
            connect_timeout=3,
        ).close()
    except psycopg.Error as exc:
        return (
            f"PostgreSQL is not reachable at {parts.hostname}:{parts.port or 5432} ({exc}).\n"
            f"{_start_postgres_hint(parts.hostname, parts.port or 5432)}\n"
            "or point PAW_TEST_DATABASE_URL at a running server."
        )
    return None


def _check_redis() -> str | None:
    import redis

    parts = urlsplit(TEST_REDIS_URL)
    try:
        client = redis.Redis.from_url(TEST_REDIS_URL, socket_connect_timeout=3)
        client.ping()
        client.flushdb()
    except redis.RedisError as exc:
        return (
            f"Redis is not reachable at {TEST_REDIS_URL} ({exc}).\n"
            f"{_start_redis_hint(parts.hostname, parts.port or 6379)}\n"
            "or point PAW_TEST_REDIS_URL at a running server."
        )
    return None


def _migrations_on_disk() -> set[tuple[str, str]]:
    """``(app label, migration name)`` of every migration file of PAW's apps (an app being
    a top-level package of the repository with a ``migrations`` package; its label is
    its folder's name)."""
    root = Path(__file__).resolve().parent.parent
    return {(path.parent.parent.name, path.stem) for path in root.glob("*/migrations/[0-9]*.py")}


def _drop_stale_test_database() -> str | None:
    """Drop the kept test database (``--reuse-db``) when it records a migration of a PAW
    app that this checkout does not have: another branch migrated it, so its tables do
    not match these models, and reusing it fails in confusing ways (a NOT NULL column
    these models never fill). pytest-django then creates it afresh. Returns what was done,
    for the report header, or ``None``."""
    import psycopg
    from psycopg import sql

    parts = urlsplit(TEST_DATABASE_URL)
    name = "test_" + parts.path.lstrip("/")
    connect = {
        "host": parts.hostname,
        "port": parts.port or 5432,
        "user": parts.username or "postgres",
        "password": parts.password,
        "connect_timeout": 3,
    }
    try:
        with psycopg.connect(dbname=name, **connect) as connection:
            recorded = set(connection.execute("SELECT app, name FROM django_migrations"))
    except psycopg.Error:
        return None  # no such database (pytest-django creates it) or no table yet
    apps = {app for app, _ in _migrations_on_disk()}
    unknown = {row for row in recorded if row[0] in apps} - _migrations_on_disk()
    if not unknown:
        return None
    with psycopg.connect(dbname="postgres", autocommit=True, **connect) as connection:
        connection.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
    example = ", ".join(sorted(f"{app}.{migration}" for app, migration in unknown)[:3])
    return (
        f"dropped the kept test database {name}: it had migrations not in this checkout ({example})"
    )


_STALE: list[str] = []


def pytest_configure(config: pytest.Config) -> None:
    problems = [
        _PROBLEMS.get("PostgreSQL") or _check_postgres(),
        _PROBLEMS.get("Redis") or _check_redis(),
    ]
    problems = [problem for problem in problems if problem]
    if problems:
        pytest.exit("\n\n".join(problems), returncode=3)
    if config.getoption("reuse_db", False) and not config.getoption("create_db", False):
        dropped = _drop_stale_test_database()
        if dropped:
            _STALE.append(dropped)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return _STALE + [
        f"private {kind} server on 127.0.0.1:{server.port} (removed at the end)"
        for kind, server in PRIVATE.items()
    ]


def pytest_unconfigure(config: pytest.Config) -> None:
    _stop_private_servers()
    shutil.rmtree(TEST_VAR_DIR, ignore_errors=True)
