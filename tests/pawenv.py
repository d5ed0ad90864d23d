"""The test environment, loaded as a pytest plugin (``-p tests.pawenv``) before Django
reads its settings.

Tests run against real services: PostgreSQL (``PAW_TEST_DATABASE_URL``, default
``postgres://postgres@127.0.0.1:5432/paw_test``; pytest-django creates ``test_<name>``)
and Redis (``PAW_TEST_REDIS_URL``, default ``redis://127.0.0.1:6379/15``, flushed at the
start of the session). If either cannot be reached the session stops at once, saying how
to start it (on the host and port of its URL). Files go to a temporary folder removed at
the end.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from urllib.parse import urlsplit

import pytest

TEST_DATABASE_URL = os.environ.setdefault(
    "PAW_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/paw_test"
)
TEST_REDIS_URL = os.environ.setdefault("PAW_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
TEST_VAR_DIR = tempfile.mkdtemp(prefix="paw-test-")

os.environ.update(
    {
        "PAW_DATABASE_URL": TEST_DATABASE_URL,
        "PAW_REDIS_URL": TEST_REDIS_URL,
        "PAW_DEBUG": "0",
        "PAW_VAR_DIR": TEST_VAR_DIR,
        "PAW_WORKSPACE_ROOT": os.path.join(TEST_VAR_DIR, "workspaces"),
        "PAW_NODE_NAME": f"test-{os.getpid()}",
    }
)
os.environ.setdefault("PAW_SECRET_KEY", "paw-test-secret-key-not-for-production")

_LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", None)


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


def pytest_configure(config: pytest.Config) -> None:
    problems = [p for p in (_check_postgres(), _check_redis()) if p]
    if problems:
        pytest.exit("\n\n".join(problems), returncode=3)


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(TEST_VAR_DIR, ignore_errors=True)
