"""The test MariaDB (or MySQL) database: on the session's server
(:func:`tests.pawenv.mariadb_url`: ``PAW_TEST_MARIADB_URL``, default
``mysql://root@127.0.0.1:3306/test``, root with an empty password as ``.ci/run`` starts it,
or a private server started when nothing answers there), in a database of the tests' own
named like the test PostgreSQL database (``PAW_TEST_DATABASE_URL``'s name, e.g.
``paw_test``); no other database is touched.

A datasource reaches it as ``paw_test_reader``, a user with ``SELECT, SHOW VIEW`` on that
database only (the way docs/vault.md says to make one), as PAW requires of a read-only
datasource; ``reader=False`` gives the server's own user, for the tests of writes."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import pytest

#: The tests' own database: named after the test PostgreSQL database, one per parallel
#: worker (``paw_test_gw0``...).
DATABASE = os.environ["PAW_TEST_DATABASE_URL"].rsplit("/", 1)[-1] + (
    f"_{os.environ['PYTEST_XDIST_WORKER']}" if os.environ.get("PYTEST_XDIST_WORKER") else ""
)

#: The hosts a test user is made for, so that it matches whichever way the client reaches
#: the server (TCP to 127.0.0.1, the socket as localhost, or any).
USER_HOSTS = ("%", "localhost", "127.0.0.1")


def drop_users(*users: str) -> None:
    """Drop the test users ``users`` at each of :data:`USER_HOSTS` (missing ones are
    skipped)."""
    server = _connect(database=None)
    with contextlib.closing(server), server.cursor() as cursor:
        for user in users:
            for host in USER_HOSTS:
                cursor.execute(f"DROP USER IF EXISTS '{user}'@'{host}'")


def _server() -> Any:
    """The session's MariaDB server URL, split (skips the test when there is none)."""
    from tests.pawenv import mariadb_url as server_url

    return urlsplit(server_url())


#: The user a read-only test datasource connects as (kept between sessions).
READER = "paw_test_reader"


def mariadb_settings(*, reader: bool = True) -> dict[str, Any]:
    """A datasource's connection settings for the test database (no password), as the
    read-only user :data:`READER` (or the server's own user with ``reader=False``)."""
    server = _server()
    return {
        "host": server.hostname or "127.0.0.1",
        "port": server.port or 3306,
        "database": DATABASE,
        "user": _reader_created() if reader else unquote(server.username or "root"),
    }


@functools.cache
def _reader_created() -> str:
    server = _connect(database=None)
    with contextlib.closing(server), server.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{DATABASE}`")
        for host in USER_HOSTS:
            cursor.execute(f"CREATE USER IF NOT EXISTS '{READER}'@'{host}'")
            cursor.execute(f"GRANT SELECT, SHOW VIEW ON `{DATABASE}`.* TO '{READER}'@'{host}'")
    return READER


def mariadb_database_url() -> str:
    """The test database as a datasource URL (``mysql://root@127.0.0.1:3306/<name>``), as
    the server's own user: paw-agent's tests write through it."""
    settings = mariadb_settings(reader=False)
    return f"mysql://{quote(settings['user'])}@{settings['host']}:{settings['port']}/{DATABASE}"


def _connect(database: str | None = DATABASE) -> Any:
    import pymysql

    settings = mariadb_settings(reader=False)
    return pymysql.connect(
        host=settings["host"],
        port=settings["port"],
        user=settings["user"],
        password=unquote(_server().password or ""),
        database=database,
        autocommit=True,
        connect_timeout=5,
    )


@contextlib.contextmanager
def mariadb_cursor() -> Iterator[Any]:
    """A cursor on the test database (autocommit)."""
    connection = _connect()
    try:
        with connection.cursor() as cursor:
            yield cursor
    finally:
        connection.close()


@pytest.fixture
def mariadb() -> Iterator[dict[str, Any]]:
    """The test MariaDB database, created if missing, with a fresh table ``shop_orders``
    (three rows, a comment on the table and a column, a foreign key to ``shop_customers``)
    and a view ``shop_totals``; they are dropped afterwards. Yields its connection
    settings."""
    server = _connect(database=None)
    with contextlib.closing(server), server.cursor() as cursor:
        cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{DATABASE}`")
    with mariadb_cursor() as cursor:
        _drop(cursor)
        cursor.execute(
            "CREATE TABLE shop_customers (id INT PRIMARY KEY, name VARCHAR(100) NOT NULL)"
            " COMMENT='People who buy'"
        )
        cursor.execute(
            "CREATE TABLE shop_orders (id INT PRIMARY KEY AUTO_INCREMENT, day VARCHAR(3),"
            " total DECIMAL(8,2) COMMENT 'in euros', customer_id INT,"
            " FOREIGN KEY (customer_id) REFERENCES shop_customers(id)) ENGINE=InnoDB"
            " COMMENT='One row per order'"
        )
        cursor.execute("INSERT INTO shop_customers VALUES (1, 'Ada'), (2, 'Grace')")
        cursor.execute(
            "INSERT INTO shop_orders (day, total, customer_id) VALUES"
            " ('Sat', 20.50, 1), ('Sun', 31.00, 2), ('Sun', 12.25, 1)"
        )
        cursor.execute(
            "CREATE VIEW shop_totals AS SELECT day, SUM(total) AS total FROM shop_orders GROUP BY day"
        )
    yield mariadb_settings()
    with mariadb_cursor() as cursor:
        _drop(cursor)


def _drop(cursor: Any) -> None:
    cursor.execute("DROP VIEW IF EXISTS shop_totals")
    cursor.execute("DROP TABLE IF EXISTS shop_orders")
    cursor.execute("DROP TABLE IF EXISTS shop_customers")
