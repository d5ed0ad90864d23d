"""Datasource connection settings: validation, the URL a sandbox gets, a live test.

URL forms (what ``PAW_DATASOURCE_<SLUG>_URL`` holds, placeholders already resolved):

* PostgreSQL: ``postgresql://user:password@host:port/database?option=value`` — a libpq
  URI, accepted as is by ``psycopg.connect(url)``. A read-only datasource adds
  ``options=-c default_transaction_read_only=on``, so the server itself refuses writes.
* MySQL / MariaDB: ``mysql://user:password@host:port/database?option=value``.
* SQLite: ``sqlite:////absolute/path.sqlite3?mode=ro`` (the SQLAlchemy / dj-database-url
  form: everything after ``sqlite:///`` up to ``?`` is the percent-encoded absolute path).
  Path and query make an SQLite URI filename:
  ``sqlite3.connect("file:" + path + "?" + query, uri=True)``; ``mode=ro`` when read-only.

User names, passwords and database names are percent-encoded (RFC 3986).
"""

from __future__ import annotations

import contextlib
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from django.core.exceptions import ValidationError

from secrets_vault.placeholders import PLACEHOLDER, placeholder_whole

#: Seconds to wait for a database to answer a connection test.
CONNECT_TIMEOUT = 5

_SERVER_KEYS = ("host", "port", "database", "user", "password", "options")
_SQLITE_KEYS = ("database", "options")


def _is_password_key(key: str) -> bool:
    lowered = key.lower()
    return "password" in lowered or "passwd" in lowered


def connection_validate(*, dialect: str, connection: Any) -> None:
    """Check datasource connection settings for ``dialect`` (``postgresql``, ``mysql``,
    ``sqlite``).

    Raises ``django.core.exceptions.ValidationError`` (on the ``connection`` field) for:
    a non-object, unknown keys, a bad port, a relative SQLite path, non-scalar options,
    and above all a password (``password``, or any option whose name contains
    "password"/"passwd") that is not exactly one ``{secret:NAME}`` placeholder.
    """

    def refuse(message: str) -> None:
        raise ValidationError({"connection": message}, code="invalid_connection")

    if not isinstance(connection, dict):
        refuse('Connection settings must be a JSON object, e.g. {"host": "...", ...}.')
    allowed = _SQLITE_KEYS if dialect == "sqlite" else _SERVER_KEYS
    unknown = sorted(set(connection) - set(allowed))
    if unknown:
        refuse(f"Unknown key(s) {', '.join(unknown)}; allowed: {', '.join(allowed)}.")

    options = connection.get("options", {})
    if not isinstance(options, dict) or not all(
        isinstance(value, str | int | float | bool) for value in options.values()
    ):
        refuse('"options" must be an object of plain values, e.g. {"sslmode": "require"}.')
    passwords = [("password", connection["password"])] if "password" in connection else []
    passwords += [(f"options.{k}", v) for k, v in options.items() if _is_password_key(k)]
    for key, value in passwords:
        if value in ("", None):
            continue
        if placeholder_whole(value) is None:
            refuse(
                f'A literal password is not accepted in "{key}": store it as a secret '
                "(admin > Secrets, or `manage.py secret set DB_PASSWORD`) and write its "
                'placeholder instead, e.g. "{secret:DB_PASSWORD}".'
            )

    for key in ("host", "user", "database"):
        if key in connection and not isinstance(connection[key], str):
            refuse(f'"{key}" must be a string.')
    if dialect == "sqlite":
        database = connection.get("database", "")
        if not database:
            refuse('An SQLite datasource needs "database": the absolute path of its file.')
        if not PLACEHOLDER.search(database) and not Path(database).is_absolute():
            refuse(f'"database" must be an absolute path, not {database!r}.')
        return
    if not connection.get("database"):
        refuse('"database" is required (the database name on the server).')
    port = connection.get("port")
    if port not in (None, ""):
        try:
            number = int(port)
        except (TypeError, ValueError):
            number = 0
        if not 0 < number < 65536:
            refuse(f'"port" must be a number from 1 to 65535, not {port!r}.')


def connection_url(*, dialect: str, connection: dict[str, Any], read_only: bool) -> str:
    """The URL of a datasource from its *resolved* connection settings (see the module
    docstring for the forms). Raises ``ValueError`` for an unknown dialect."""
    options = {key: _option_text(value) for key, value in connection.get("options", {}).items()}
    if dialect == "sqlite":
        if read_only:
            options["mode"] = "ro"
        path = quote(str(connection["database"]), safe="/")
        return f"sqlite:///{path}" + (f"?{urlencode(options)}" if options else "")
    if dialect not in ("postgresql", "mysql"):
        raise ValueError(f"unknown dialect {dialect!r}")
    if dialect == "postgresql" and read_only:
        flag = "-c default_transaction_read_only=on"
        options["options"] = f"{options['options']} {flag}" if options.get("options") else flag
    user = quote(str(connection.get("user") or ""), safe="")
    password = quote(str(connection.get("password") or ""), safe="")
    userinfo = ""
    if user or password:
        userinfo = user + (f":{password}" if password else "") + "@"
    host = str(connection.get("host") or "localhost")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    port = f":{int(connection['port'])}" if connection.get("port") not in (None, "") else ""
    database = quote(str(connection.get("database") or ""), safe="")
    query = f"?{urlencode(options, quote_via=quote)}" if options else ""
    return f"{dialect}://{userinfo}{host}{port}/{database}{query}"


def _option_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


@dataclass(frozen=True)
class ConnectionTestResult:
    """What a connection test found: ``ok`` and a one-line ``message`` for the operator
    (the server version, or why it failed)."""

    ok: bool
    message: str


def connection_test(
    *, dialect: str, connection: dict[str, Any], read_only: bool
) -> ConnectionTestResult:
    """Really connect to the database described by *resolved* ``connection`` settings and
    run one harmless query, within :data:`CONNECT_TIMEOUT` seconds. Never raises for a
    database failure: it is reported in the result. The caller masks secret values in
    the message (a driver may echo what it was given)."""
    try:
        if dialect == "postgresql":
            return _test_postgresql(connection, read_only)
        if dialect == "sqlite":
            return _test_sqlite(connection, read_only)
        if dialect == "mysql":
            return _test_mysql(connection, read_only)
        return ConnectionTestResult(False, f"Unknown dialect {dialect!r}.")
    except Exception as exc:  # any driver failure is the answer
        text = " ".join(str(exc).split()) or type(exc).__name__
        return ConnectionTestResult(False, f"Connection failed: {text}")


def _test_postgresql(connection: dict[str, Any], read_only: bool) -> ConnectionTestResult:
    import psycopg

    url = connection_url(dialect="postgresql", connection=connection, read_only=read_only)
    with psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        ro = conn.execute("SHOW default_transaction_read_only").fetchone()[0] == "on"
    mode = "read-only" if ro else "read-write"
    return ConnectionTestResult(True, f"Connected to PostgreSQL {version} ({mode}).")


def _test_sqlite(connection: dict[str, Any], read_only: bool) -> ConnectionTestResult:
    path = Path(str(connection.get("database", "")))
    if not path.is_file():
        # sqlite3 would create an empty database; a test must not.
        return ConnectionTestResult(False, f"Connection failed: no such file {path}.")
    mode = "ro" if read_only else "rw"
    uri = f"file:{quote(str(path), safe='/')}?mode={mode}"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=CONNECT_TIMEOUT)) as conn:
        tables = conn.execute("SELECT count(*) FROM sqlite_master WHERE type = 'table'")
        count = tables.fetchone()[0]
    mode_text = "read-only" if read_only else "read-write"
    return ConnectionTestResult(
        True, f"Connected to SQLite {sqlite3.sqlite_version} ({mode_text}), {count} table(s)."
    )


def _test_mysql(connection: dict[str, Any], read_only: bool) -> ConnectionTestResult:
    try:
        import pymysql
    except ImportError:
        return ConnectionTestResult(False, "The MySQL driver (PyMySQL) is not installed.")
    conn = pymysql.connect(
        host=connection.get("host") or "localhost",
        port=int(connection.get("port") or 3306),
        user=connection.get("user") or None,
        password=connection.get("password") or "",
        database=connection.get("database") or None,
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=CONNECT_TIMEOUT,
    )
    with contextlib.closing(conn), conn.cursor() as cursor:
        if read_only:
            cursor.execute("SET SESSION TRANSACTION READ ONLY")
        cursor.execute("SELECT VERSION()")
        version = cursor.fetchone()[0]
    mode = "read-only" if read_only else "read-write"
    return ConnectionTestResult(True, f"Connected to MySQL/MariaDB {version} ({mode}).")
