"""Datasources given to the sandbox, and ``run_sql`` on them.

The host passes ``PAW_DATASOURCES``, a JSON list of ``{"slug", "name", "dialect",
"description", "env", "read_only"}``, and one ``PAW_DATASOURCE_<SLUG>_URL`` per datasource
(or the variable named by ``env``) holding the connection URL (issue 3). Dialects:
``postgresql`` (psycopg 3, ``postgres://`` / ``postgresql://`` URLs), ``mysql`` (MySQL and
MariaDB through PyMySQL, ``mysql://user:password@host:3306/database``) and ``sqlite`` (the
stdlib, ``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or a plain path).

What counts as a read, a SQL parser decides (``paw_sqlcheck``, a distribution of its own
that PAW's server installs too, for knowledge examples): one ``SELECT`` / ``WITH`` /
``EXPLAIN`` of the datasource's dialect, nothing in its tree that changes data, and only
functions on that dialect's allow-list. Anything else needs an approval, and is refused on
a read-only datasource. Connections are set so the database reads a statement as the
parser did (``paw_sqlcheck.POSTGRESQL_SESSION_OPTIONS``, ``mysql_sql_mode``). Reads
also run in read-only mode (a PostgreSQL READ ONLY transaction, MySQL ``START TRANSACTION
READ ONLY``, SQLite ``mode=ro``), so a function with side effects or a clever query cannot
write behind a "read"; SQLite connections cap a value at
``paw_sqlcheck.SQLITE_MAX_LENGTH`` bytes, so a small statement cannot build a huge
string. A read's rows are streamed (a server-side cursor on PostgreSQL, an unbuffered
one on MySQL): the first ones are kept, the rest only counted.
"""

from __future__ import annotations

import contextlib
import datetime
import decimal
import json
import math
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from paw_agent.control import RunControl
from paw_sqlcheck import (
    POSTGRESQL_SESSION_OPTIONS,
    mysql_mode_lexes_as_parsed,
    mysql_sql_mode,
    sqlite_limit,
)

ROW_CAP = 200  # rows returned to the model per query
CELL_CAP = 200  # characters per cell shown to the model
COUNT_CAP = 100_000  # rows of a result counted (and read) at most
FETCH = 1000  # rows fetched at a time
VALUE_CAP = 1000  # characters of a string value in a structured result
STRUCTURED_CAP = 256 * 1024  # characters of a structured result's rows (JSON)
DIALECTS = {"postgresql": "postgresql", "postgres": "postgresql", "sqlite": "sqlite",
            "sqlite3": "sqlite", "mysql": "mysql", "mariadb": "mysql"}  # fmt: skip


class SqlError(Exception):
    """A query that cannot run (unknown datasource, missing URL, driver error); the
    message is written for the model. ``code`` says which, for the host's audit
    (``notify tool`` ``sql_run``): ``connect_failed`` (no URL or file, a malformed URL,
    the connection refused), ``session_mismatch`` (a session that does not lex as the
    parser, nothing run), ``timeout`` (the statement ran out of time),
    ``interrupted`` (the run was stopped while the statement ran: a cancel cancels the
    query, which the database reports as it reports a timeout) or ``database_error``
    (the database refused the statement)."""

    def __init__(self, message: str, *, code: str = "database_error") -> None:
        super().__init__(message)
        self.code = code


@dataclass
class Datasource:
    """One datasource: ``slug`` (the name the model uses), ``name``, ``dialect``
    (``postgresql`` | ``mysql`` | ``sqlite``), ``description``, ``url`` (None when its variable is
    missing) and ``read_only`` (the operator's flag: writes are refused, approved or not)."""

    slug: str
    name: str
    dialect: str
    description: str
    url: str | None
    read_only: bool = False


def url_variable(slug: str) -> str:
    """``PAW_DATASOURCE_<SLUG>_URL`` with the slug upper-cased, other characters as ``_``."""
    return f"PAW_DATASOURCE_{re.sub(r'[^A-Za-z0-9]', '_', slug).upper()}_URL"


def load_datasources(environ: Mapping[str, str]) -> tuple[list[Datasource], list[str]]:
    """The datasources described in ``environ`` and warnings about broken entries (bad
    JSON, an unknown dialect, a missing URL variable); never raises."""
    raw = environ.get("PAW_DATASOURCES")
    if not raw:
        return [], []
    try:
        entries = json.loads(raw)
        if not isinstance(entries, list):
            raise ValueError("not a list")
    except ValueError as exc:
        return [], [f"PAW_DATASOURCES is not a JSON list ({exc}); no datasources"]
    found, warnings = [], []
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("slug"), str):
            warnings.append(f"datasource entry without a slug ignored: {entry!r:.80}")
            continue
        slug = entry["slug"]
        given = str(entry.get("dialect") or "").lower()
        dialect = DIALECTS.get(given)
        if dialect is None:
            warnings.append(f"datasource {slug}: unsupported dialect {given!r}; ignored")
            continue
        variable = entry.get("env") or url_variable(slug)
        url = environ.get(str(variable))
        if not url:
            warnings.append(f"datasource {slug}: no URL in {variable}")
        found.append(
            Datasource(
                slug=slug,
                name=str(entry.get("name") or slug),
                dialect=dialect,
                description=str(entry.get("description") or ""),
                url=url,
                read_only=entry.get("read_only") is True,
            )
        )
    return found, warnings


def _cell(value: Any) -> str:
    if value is None:
        text = "NULL"
    elif isinstance(value, dict | list | tuple | datetime.timedelta):
        shown = json_value(value, cap=None)
        text = shown if isinstance(shown, str) else json.dumps(shown, ensure_ascii=False)
    else:
        text = str(value)
    text = text.replace("\n", " ").replace("|", "\\|")
    return text if len(text) <= CELL_CAP else text[: CELL_CAP - 1] + "…"


def iso_duration(value: datetime.timedelta) -> str:
    """A ``timedelta`` as an ISO 8601 duration: ``P1DT2H``, ``PT1.5S``, ``PT0S``; a
    negative one with a leading ``-`` (``-P1D``: ISO 8601-2). Days are 24 hours (a
    PostgreSQL interval's months arrive as 30 days, as psycopg converts them)."""
    sign = "-" if value < datetime.timedelta(0) else ""
    value = abs(value)
    hours, rest = divmod(value.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    text = "P" + (f"{value.days}D" if value.days else "")
    clock = (f"{hours}H" if hours else "") + (f"{minutes}M" if minutes else "")
    if seconds or value.microseconds:
        fraction = f".{value.microseconds:06d}".rstrip("0") if value.microseconds else ""
        clock += f"{seconds}{fraction}S"
    if clock:
        text += "T" + clock
    return sign + (text if text != "P" else "PT0S")


def _decimal_value(value: decimal.Decimal) -> Any:
    if not value.is_finite():
        return str(value)
    if value == value.to_integral_value():
        return int(value) if abs(value) < 2**53 else str(value)
    as_float = float(value)
    # A float only when it says exactly the same number (12.25, 20.5); otherwise its
    # exact text ("12345678901234567890.123"), which a float would round.
    return as_float if decimal.Decimal(repr(as_float)) == value else str(value)


def json_value(value: Any, *, cap: int | None = VALUE_CAP) -> Any:
    """A database value as JSON: ``None``, booleans, ints and finite floats as they are
    (NaN and infinities as text); a ``Decimal`` an int (integral, below 2**53) or a float
    when that float is exactly the same number, else its exact text
    (``"12345678901234567890.123"``); dicts and lists (``jsonb``, arrays) as JSON objects
    and arrays, converted recursively (keys as text); dates and times ISO 8601; a
    ``timedelta`` (an ``interval``) an ISO 8601 duration (:func:`iso_duration`); bytes
    ``<N bytes>``; anything else its text. Strings are cut at ``cap`` characters
    (:data:`VALUE_CAP`; None keeps them whole)."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, decimal.Decimal):
        return _decimal_value(value)
    if isinstance(value, dict):
        return {str(key): json_value(item, cap=cap) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(item, cap=cap) for item in value]
    if isinstance(value, datetime.timedelta):
        return iso_duration(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(bytes(value))} bytes>"
    text = str(value)
    return text if cap is None or len(text) <= cap else text[: cap - 1] + "…"


@dataclass
class QueryResult:
    """What a statement did: its ``columns`` (empty without a result set), the first
    ``rows`` (at most the ``keep`` asked for), ``row_count`` (rows returned, counted up
    to :data:`COUNT_CAP`; for a write, rows changed), ``counted_all`` (False when counting
    stopped at the cap) and ``status`` (the driver's word for a write, e.g. ``UPDATE 1``)."""

    columns: list[str]
    rows: list[tuple]
    row_count: int
    counted_all: bool = True
    status: str = ""

    def text(self) -> str:
        """The outcome for the model: a Markdown table of at most :data:`ROW_CAP` rows
        with a line saying what was cut, or the rows changed."""
        if not self.columns:
            status = f" ({self.status})" if self.status else ""
            return f"statement executed{status}; {max(self.row_count, 0)} rows changed"
        return format_rows(
            self.columns, self.rows[:ROW_CAP], self.row_count, counted_all=self.counted_all
        )

    def structured(self, *, datasource: str, sql: str, rows: int) -> dict[str, Any] | None:
        """The result as data for the host (``notify tool`` ``sql_result``):
        ``{"datasource", "sql", "columns", "rows" (the first ``rows``, JSON values, within
        :data:`STRUCTURED_CAP` characters), "row_count", "truncated"}``; None for a
        statement without a result set."""
        if not self.columns:
            return None
        kept, size = [], 0
        for row in self.rows[: max(0, rows)]:
            values = [json_value(v) for v in row]
            size += len(json.dumps(values, ensure_ascii=False, default=str))
            if size > STRUCTURED_CAP:
                break
            kept.append(values)
        return {
            "datasource": datasource,
            "sql": sql.strip(),
            "columns": list(self.columns),
            "rows": kept,
            "row_count": self.row_count,
            "truncated": len(kept) < self.row_count,
        }


def format_rows(
    columns: list[str], rows: list[tuple], row_count: int, *, counted_all: bool = True
) -> str:
    """A Markdown table of ``rows`` (already capped) with a line saying what was cut:
    ``(2 rows)``, ``(first 200 of 500 rows shown; row cap 200)``."""
    if not columns:
        return "(no result set)"
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    count = f"{len(rows)} row{'s' if len(rows) != 1 else ''}"
    if row_count > len(rows):
        total = f"{row_count:,}" if counted_all else f"more than {row_count:,}"
        count = f"first {len(rows)} of {total} rows shown; row cap {ROW_CAP}"
    return "\n".join(lines) + f"\n\n({count})"


def _collect(fetchmany: Any, keep: int) -> tuple[list[tuple], int, bool]:
    """Read a result set in batches: ``(the first keep rows, rows counted, counted_all)``,
    counting at most :data:`COUNT_CAP` rows."""
    kept: list[tuple] = []
    counted = 0
    while counted < COUNT_CAP:
        batch = fetchmany(FETCH)
        if not batch:
            return kept, counted, True
        counted += len(batch)
        if len(kept) < keep:
            kept += [tuple(row) for row in batch[: keep - len(kept)]]
    return kept, counted, not fetchmany(1)


def sqlite_location(url: str) -> tuple[str, bool]:
    """``(path, read_only)`` of a SQLite URL: ``sqlite:////abs/path.db?mode=ro`` (the form
    PAW writes: the percent-encoded path after ``sqlite:///``, options after ``?``),
    ``sqlite:///relative.db`` (from the workspace), or ``sqlite://`` (in memory).
    ``read_only`` is True when the URL says ``mode=ro``."""
    rest = url
    for prefix in ("sqlite:///", "sqlite://"):
        if url.startswith(prefix):
            rest = url[len(prefix) :]
            break
    path, _, query = rest.partition("?")
    options = parse_qs(query)
    return unquote(path) or ":memory:", "ro" in options.get("mode", [])


def run_query(
    source: Datasource,
    sql: str,
    *,
    read_only: bool,
    timeout: float,
    control: RunControl,
    keep: int = ROW_CAP,
    explain: bool = False,
) -> QueryResult:
    """Run ``sql`` on ``source``: the first ``keep`` rows (at least :data:`ROW_CAP`) and
    the count of the rest, or the number of rows changed. ``read_only`` (a statement
    ``paw_sqlcheck`` judged a read) runs it in read-only mode, streamed where the driver
    can (``explain``: it is an ``EXPLAIN``, which PostgreSQL cannot read through a
    cursor); a write is committed. ``timeout`` seconds bound the statement. A stopped run
    cancels the query and raises ``Stopped``; driver errors raise :class:`SqlError`."""
    if not source.url:
        raise SqlError(
            f"datasource {source.slug} has no connection URL "
            f"({url_variable(source.slug)} is not set)",
            code="connect_failed",
        )
    if source.dialect == "postgresql":
        return _run_postgres(
            source, sql, read_only=read_only, timeout=timeout, control=control,
            keep=max(keep, ROW_CAP), streamed=read_only and not explain,
        )  # fmt: skip
    run = _run_mysql if source.dialect == "mysql" else _run_sqlite
    return run(
        source, sql, read_only=read_only, timeout=timeout, control=control, keep=max(keep, ROW_CAP)
    )


def _run_sqlite(
    source: Datasource, sql: str, *, read_only: bool, timeout: float, control: RunControl, keep: int
) -> QueryResult:
    import sqlite3

    path, url_read_only = sqlite_location(source.url or "")
    if path != ":memory:" and not os.path.exists(path):
        raise SqlError(
            f"the SQLite file of datasource {source.slug} does not exist", code="connect_failed"
        )
    mode = "ro" if read_only or url_read_only else "rw"
    uri = f"file:{path}?mode={mode}" if path != ":memory:" else ":memory:"
    connection = sqlite_limit(
        sqlite3.connect(
            uri, uri=path != ":memory:", timeout=min(timeout, 10), check_same_thread=False
        )
    )

    def work() -> QueryResult:
        try:
            cursor = connection.execute(sql)
            if cursor.description is None:
                connection.commit()
                return QueryResult([], [], cursor.rowcount)
            columns = [d[0] for d in cursor.description]
            rows, count, counted_all = _collect(cursor.fetchmany, keep)
            if not read_only:
                connection.commit()
            return QueryResult(columns, rows, count, counted_all)
        except sqlite3.Error as exc:
            code = _failure_code(control, timed_out=timer.fired)
            raise SqlError(f"SQLite error: {exc}", code=code) from exc
        finally:
            connection.close()

    timer = _Timer(timeout, connection.interrupt)
    try:
        return control.call(work, on_stop=connection.interrupt)
    finally:
        timer.cancel()


def _run_postgres(
    source: Datasource,
    sql: str,
    *,
    read_only: bool,
    timeout: float,
    control: RunControl,
    keep: int,
    streamed: bool,
) -> QueryResult:
    """``streamed``: read through a server-side cursor (``DECLARE … CURSOR FOR`` takes a
    query, which a read other than EXPLAIN is)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    # The URL's own options (a read-only datasource's default_transaction_read_only) stay:
    # the statement timeout is added to them, not put in their place.
    try:
        options = conninfo_to_dict(source.url or "").get("options") or ""
    except psycopg.Error as exc:
        raise SqlError(
            f"the URL of datasource {source.slug} is malformed: {exc}", code="connect_failed"
        ) from exc
    options = (
        f"{options} -c statement_timeout={int(timeout * 1000)} {POSTGRESQL_SESSION_OPTIONS}"
    ).strip()
    try:
        connection = control.call(
            lambda: psycopg.connect(
                source.url,
                connect_timeout=10,
                application_name="paw-agent",
                options=options,
            )
        )
    except psycopg.Error as exc:
        raise SqlError(
            f"cannot connect to datasource {source.slug}: {exc}", code="connect_failed"
        ) from exc
    # True makes psycopg begin READ ONLY; None leaves the server's default (a read-only
    # datasource's URL sets it): False would begin READ WRITE and override that.
    connection.read_only = True if read_only or source.read_only else None
    # The session must read strings as the parser did (a pooler may drop the option).
    if connection.info.parameter_status("standard_conforming_strings") != "on":
        connection.close()
        raise SqlError(
            f"datasource {source.slug}: the server keeps standard_conforming_strings off, so "
            "PAW cannot tell what a statement does there; nothing was run",
            code="session_mismatch",
        )

    def work() -> QueryResult:
        try:
            cursor = connection.cursor(name="paw_agent_read") if streamed else connection.cursor()
            with cursor:
                cursor.execute(sql)
                if cursor.description is None:
                    connection.commit()
                    return QueryResult([], [], cursor.rowcount, status=cursor.statusmessage or "")
                columns = [d.name for d in cursor.description]
                rows, count, counted_all = _collect(cursor.fetchmany, keep)
            if read_only:
                connection.rollback()
            else:
                connection.commit()
            return QueryResult(columns, rows, count, counted_all)
        except psycopg.Error as exc:
            timed_out = isinstance(exc, psycopg.errors.QueryCanceled)
            raise SqlError(
                f"PostgreSQL error: {str(exc).strip()}",
                code=_failure_code(control, timed_out=timed_out),
            ) from exc
        finally:
            connection.close()

    return control.call(work, on_stop=connection.cancel_safe)


def mysql_parameters(url: str) -> dict[str, Any]:
    """PyMySQL ``connect()`` keywords from ``mysql://user:password@host:port/database``
    (percent-encoded parts, as PAW writes them); the query's TLS options (``ssl_ca``,
    ``ssl_cert``, ``ssl_key``, ``ssl_verify_cert``, ``ssl_verify_identity``,
    ``ssl_disabled``) are passed on. Raises :class:`SqlError` for another scheme."""
    parts = urlsplit(url)
    if parts.scheme not in ("mysql", "mariadb", "mysql+pymysql"):
        raise SqlError("a MySQL datasource's URL starts with mysql://", code="connect_failed")
    parameters: dict[str, Any] = {
        "host": parts.hostname or "localhost",
        "port": parts.port or 3306,
        "user": unquote(parts.username) if parts.username else None,
        "password": unquote(parts.password) if parts.password else "",
        "database": unquote(parts.path.lstrip("/")) or None,
    }
    for key, values in parse_qs(parts.query).items():
        if key in ("ssl_ca", "ssl_cert", "ssl_key"):
            parameters[key] = values[-1]
        elif key in ("ssl_verify_cert", "ssl_verify_identity", "ssl_disabled"):
            parameters[key] = values[-1].lower() in ("1", "true", "yes")
    return parameters


def _run_mysql(
    source: Datasource, sql: str, *, read_only: bool, timeout: float, control: RunControl, keep: int
) -> QueryResult:
    import pymysql
    import pymysql.cursors

    parameters = mysql_parameters(source.url or "")
    try:
        connection = control.call(
            lambda: pymysql.connect(
                **parameters,
                connect_timeout=10,
                read_timeout=timeout + 10,  # a backstop behind the server's own limit
                charset="utf8mb4",
                autocommit=False,
            )
        )
    except pymysql.MySQLError as exc:
        raise SqlError(
            f"cannot connect to datasource {source.slug}: {exc}", code="connect_failed"
        ) from exc
    thread_id = connection.thread_id()
    killed = threading.Event()

    def kill() -> None:
        """Stop the statement from a second connection (``KILL QUERY``): PyMySQL cannot
        interrupt its own blocking read."""
        killed.set()
        with contextlib.suppress(Exception):
            other = pymysql.connect(**parameters, connect_timeout=5, read_timeout=5)
            with contextlib.closing(other), other.cursor() as cursor:
                cursor.execute(f"KILL QUERY {int(thread_id)}")

    def work() -> QueryResult:
        try:
            with connection.cursor() as setup:
                setup.execute("SELECT VERSION()")
                # A deliberate twin of secrets_vault.connections.database_connection's set-up
                # (the runtime imports nothing of PAW's server): the same limits there.
                if "mariadb" in str(setup.fetchone()[0]).lower():
                    setup.execute(f"SET SESSION max_statement_time = {float(timeout)}")
                else:
                    setup.execute(f"SET SESSION max_execution_time = {int(timeout * 1000)}")
                setup.execute("SELECT @@SESSION.sql_mode")
                setup.execute("SET SESSION sql_mode = %s", (mysql_sql_mode(setup.fetchone()[0]),))
                setup.execute("SELECT @@SESSION.sql_mode")
                if not mysql_mode_lexes_as_parsed(setup.fetchone()[0]):
                    raise SqlError(
                        f"datasource {source.slug}: the server keeps ANSI_QUOTES or "
                        "NO_BACKSLASH_ESCAPES on, so PAW cannot tell what a statement does "
                        "there; nothing was run",
                        code="session_mismatch",
                    )
                if source.read_only:
                    setup.execute("SET SESSION TRANSACTION READ ONLY")
                setup.execute("START TRANSACTION READ ONLY" if read_only else "START TRANSACTION")
            cursor_class = pymysql.cursors.SSCursor if read_only else pymysql.cursors.Cursor
            cursor = connection.cursor(cursor_class)
            cursor.execute(sql)
            if cursor.description is None:
                connection.commit()
                return QueryResult([], [], cursor.rowcount)
            columns = [d[0] for d in cursor.description]
            rows, count, counted_all = _collect(cursor.fetchmany, keep)
            if counted_all:
                cursor.close()
                if not read_only:
                    connection.commit()
            return QueryResult(columns, rows, count, counted_all)
        except pymysql.MySQLError as exc:
            if killed.is_set() and timer.fired and not control.stopped:
                raise SqlError(
                    f"MySQL error: the statement ran longer than {timeout:g} s", code="timeout"
                ) from exc
            raise SqlError(
                f"MySQL error: {exc.args[-1] if exc.args else exc}",
                code=_failure_code(control, timed_out=False),
            ) from exc
        finally:
            # Closing the socket, not the cursor: an unbuffered cursor would read every row
            # it left behind first. The server rolls an unfinished transaction back.
            with contextlib.suppress(Exception):
                connection.close()

    timer = _Timer(timeout + 1, kill)
    try:
        return control.call(work, on_stop=kill)
    finally:
        timer.cancel()


def _failure_code(control: RunControl, *, timed_out: bool) -> str:
    """The :class:`SqlError` code of a statement the database broke off: ``interrupted``
    when the run was stopped meanwhile (its stop hook cancelled the query), else
    ``timeout`` when the statement's own limit fired, else ``database_error``."""
    if control.stopped:
        return "interrupted"
    return "timeout" if timed_out else "database_error"


class _Timer:
    """Calls ``action`` after ``seconds`` unless cancelled (SQLite has no statement
    timeout of its own; MySQL's covers only some statements); ``fired`` once it did."""

    def __init__(self, seconds: float, action: Any) -> None:
        self.fired = False

        def fire() -> None:
            self.fired = True
            action()

        self._timer = threading.Timer(seconds, fire)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        """Do not call the action."""
        self._timer.cancel()
