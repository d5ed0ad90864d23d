"""A PostgreSQL database for datasource tests, beside PAW's own test database.

A datasource may never be PAW's own database (``connections.connection_is_paw_database``),
so the tests point PostgreSQL datasources at ``<test database>_ds`` on the same server:
created on first use (and kept, like the test database itself), its tables made with
:func:`pg_datasource_connect` (as the server's superuser).

A datasource reaches it as a user that can only read, ``paw_test_reader`` (a member of
``pg_read_all_data``, nothing more: the way docs/vault.md says to make one), as PAW
requires of a read-only datasource; ``reader=False`` gives the superuser, for the tests of
writes and of what the parser alone must stop.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any


def _server() -> dict[str, Any]:
    from django.db import connection

    settings = connection.settings_dict
    return {
        "host": settings["HOST"] or "127.0.0.1",
        "port": int(settings["PORT"] or 5432),
        "user": settings["USER"] or "postgres",
        "name": settings["NAME"],
    }


@functools.cache
def _created(name: str) -> str:
    import psycopg

    server = _server()
    with psycopg.connect(
        host=server["host"], port=server["port"], user=server["user"], dbname="postgres",
        autocommit=True,
    ) as conn:  # fmt: skip
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')
    return name


#: The role a read-only test datasource connects as (cluster-wide, kept between sessions).
READER = "paw_test_reader"


@functools.cache
def _reader_created() -> str:
    import psycopg

    server = _server()
    with psycopg.connect(
        host=server["host"], port=server["port"], user=server["user"], dbname="postgres",
        autocommit=True,
    ) as conn:  # fmt: skip
        # Made by an earlier (or a concurrent) session already: fine.
        with contextlib.suppress(psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            conn.execute(f"CREATE ROLE {READER} LOGIN")
        conn.execute(f"GRANT pg_read_all_data TO {READER}")
    return READER


def pg_datasource_settings(*, reader: bool = True) -> dict[str, Any]:
    """``{host, port, database, user}`` of the datasource test database (created when
    missing): a PostgreSQL datasource's connection settings, as the read-only user
    :data:`READER` (or the server's superuser with ``reader=False``)."""
    server = _server()
    name = _created(f"{server['name']}_ds")
    user = _reader_created() if reader else server["user"]
    return {"host": server["host"], "port": server["port"], "database": name, "user": user}


@contextlib.contextmanager
def pg_datasource_connect() -> Iterator[Any]:
    """An autocommit psycopg connection to the datasource test database."""
    import psycopg

    settings = pg_datasource_settings(reader=False)
    with psycopg.connect(
        host=settings["host"], port=settings["port"], user=settings["user"],
        dbname=settings["database"], autocommit=True,
    ) as conn:  # fmt: skip
        yield conn
