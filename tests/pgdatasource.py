"""A PostgreSQL database for datasource tests, beside PAW's own test database.

A datasource may never be PAW's own database (``connections.connection_is_paw_database``),
so the tests point PostgreSQL datasources at ``<test database>_ds`` on the same server:
created on first use (and kept, like the test database itself), its tables made with
:func:`pg_datasource_connect`.
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


def pg_datasource_settings() -> dict[str, Any]:
    """``{host, port, database, user}`` of the datasource test database (created when
    missing): a PostgreSQL datasource's connection settings."""
    server = _server()
    name = _created(f"{server['name']}_ds")
    return {"host": server["host"], "port": server["port"], "database": name,
            "user": server["user"]}  # fmt: skip


@contextlib.contextmanager
def pg_datasource_connect() -> Iterator[Any]:
    """An autocommit psycopg connection to the datasource test database."""
    import psycopg

    settings = pg_datasource_settings()
    with psycopg.connect(
        host=settings["host"], port=settings["port"], user=settings["user"],
        dbname=settings["database"], autocommit=True,
    ) as conn:  # fmt: skip
        yield conn
