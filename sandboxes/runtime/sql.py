"""Datasources given to the sandbox, and ``run_sql`` on them.

The host passes ``PAW_DATASOURCES``, a JSON list of ``{"slug", "name", "dialect",
"description", "env"}``, and one ``PAW_DATASOURCE_<SLUG>_URL`` per datasource (or the
variable named by ``env``) holding the connection URL (issue 3). Dialects: ``postgresql``
(psycopg 3, ``postgres://`` / ``postgresql://`` URLs) and ``sqlite`` (the stdlib,
``sqlite:///relative/path.db``, ``sqlite:////absolute/path.db`` or a plain path).

Only a single ``SELECT`` / ``WITH`` / ``EXPLAIN`` statement without data-changing keywords
counts as a read; anything else is a write, which the tool gates behind an approval. Reads
also run in read-only mode (a PostgreSQL READ ONLY transaction, SQLite ``mode=ro``), so a
function with side effects or a clever query cannot write behind a "read".
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote

from sandboxes.runtime.control import RunControl

ROW_CAP = 200  # rows returned to the model per query
CELL_CAP = 200  # characters per cell

READ_KEYWORDS = {"select", "with", "explain"}
# Keywords that make a SELECT / WITH / EXPLAIN change data: data-modifying CTEs, EXPLAIN
# ANALYZE of a write, SELECT INTO, row locks (FOR UPDATE). Other statements already fail
# the first-keyword test.
WRITE_KEYWORDS = {
    "insert",
    "update",
    "delete",
    "merge",
    "upsert",
    "into",
    "create",
    "drop",
    "alter",
    "truncate",
    "copy",
    "grant",
    "revoke",
    "lock",
}
_STRIP = re.compile(
    r"""--[^\n]*|/\*.*?\*/|'(?:[^']|'')*'|"(?:[^"]|"")*"|\$([A-Za-z_]*)\$.*?\$\1\$""",
    re.DOTALL,
)


class SqlError(Exception):
    """A query that cannot run (unknown datasource, missing URL, driver error); the
    message is written for the model."""


@dataclass
class Datasource:
    """One datasource: ``slug`` (the name the model uses), ``name``, ``dialect``
    (``postgresql`` | ``sqlite``), ``description``, ``url`` (None when its variable is
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
        dialect = str(entry.get("dialect") or "").lower()
        dialect = {"postgres": "postgresql", "sqlite3": "sqlite"}.get(dialect, dialect)
        if dialect not in ("postgresql", "sqlite"):
            warnings.append(f"datasource {slug}: unsupported dialect {dialect!r}; ignored")
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


def statements(sql: str) -> list[str]:
    """The statements of ``sql`` with comments and string literals blanked out (for
    keyword checks only), split on top-level ``;``; empty ones dropped."""
    blanked = _STRIP.sub(" '' ", sql)
    return [part.strip() for part in blanked.split(";") if part.strip()]


def is_read_only(sql: str) -> bool:
    """True when ``sql`` is one SELECT / WITH / EXPLAIN statement with no data-changing
    keyword anywhere (``EXPLAIN ANALYZE DELETE``, ``WITH … DELETE``, ``SELECT … INTO`` are
    writes)."""
    parts = statements(sql)
    if len(parts) != 1:
        return False
    words = {w.lower() for w in re.findall(r"[A-Za-z_]+", parts[0])}
    first = re.match(r"\(*\s*([A-Za-z]+)", parts[0])
    return bool(first) and first.group(1).lower() in READ_KEYWORDS and not (words & WRITE_KEYWORDS)


def _cell(value: Any) -> str:
    text = "NULL" if value is None else str(value)
    text = text.replace("\n", " ").replace("|", "\\|")
    return text if len(text) <= CELL_CAP else text[: CELL_CAP - 1] + "…"


def format_rows(columns: list[str], rows: list[tuple], more: bool) -> str:
    """A Markdown table of ``rows`` (already capped) with a line saying what was cut."""
    if not columns:
        return "(no result set)"
    lines = ["| " + " | ".join(_cell(c) for c in columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    count = f"{len(rows)} row{'s' if len(rows) != 1 else ''}"
    if more:
        count = f"first {len(rows)} rows shown (row cap {ROW_CAP}); more rows exist"
    return "\n".join(lines) + f"\n\n({count})"


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
    source: Datasource, sql: str, *, read_only: bool, timeout: float, control: RunControl
) -> str:
    """Run ``sql`` on ``source`` and describe the outcome as text for the model (a table
    of at most :data:`ROW_CAP` rows, or the number of rows changed). ``read_only`` runs it
    in read-only mode; a write is committed. ``timeout`` seconds bound the statement. A
    stopped run cancels the query and raises ``Stopped``; driver errors raise
    :class:`SqlError`."""
    if not source.url:
        raise SqlError(
            f"datasource {source.slug} has no connection URL "
            f"({url_variable(source.slug)} is not set)"
        )
    if source.dialect == "sqlite":
        return _run_sqlite(source, sql, read_only=read_only, timeout=timeout, control=control)
    return _run_postgres(source, sql, read_only=read_only, timeout=timeout, control=control)


def _run_sqlite(
    source: Datasource, sql: str, *, read_only: bool, timeout: float, control: RunControl
) -> str:
    import sqlite3

    path, url_read_only = sqlite_location(source.url or "")
    if path != ":memory:" and not os.path.exists(path):
        raise SqlError(f"the SQLite file of datasource {source.slug} does not exist")
    mode = "ro" if read_only or url_read_only else "rw"
    uri = f"file:{path}?mode={mode}" if path != ":memory:" else ":memory:"
    connection = sqlite3.connect(
        uri, uri=path != ":memory:", timeout=min(timeout, 10), check_same_thread=False
    )

    def work() -> str:
        try:
            cursor = connection.execute(sql)
            if cursor.description is None:
                connection.commit()
                return f"statement executed; {max(cursor.rowcount, 0)} rows changed"
            columns = [d[0] for d in cursor.description]
            rows = cursor.fetchmany(ROW_CAP + 1)
            if not read_only:
                connection.commit()
            return format_rows(columns, rows[:ROW_CAP], len(rows) > ROW_CAP)
        except sqlite3.Error as exc:
            raise SqlError(f"SQLite error: {exc}") from exc
        finally:
            connection.close()

    timer = _Timer(timeout, connection.interrupt)
    try:
        return control.call(work, on_stop=connection.interrupt)
    finally:
        timer.cancel()


def _run_postgres(
    source: Datasource, sql: str, *, read_only: bool, timeout: float, control: RunControl
) -> str:
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    # The URL's own options (a read-only datasource's default_transaction_read_only) stay:
    # the statement timeout is added to them, not put in their place.
    try:
        options = conninfo_to_dict(source.url or "").get("options") or ""
    except psycopg.Error as exc:
        raise SqlError(f"the URL of datasource {source.slug} is malformed: {exc}") from exc
    options = f"{options} -c statement_timeout={int(timeout * 1000)}".strip()
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
        raise SqlError(f"cannot connect to datasource {source.slug}: {exc}") from exc
    # True makes psycopg begin READ ONLY; None leaves the server's default (a read-only
    # datasource's URL sets it): False would begin READ WRITE and override that.
    connection.read_only = True if read_only or source.read_only else None

    def work() -> str:
        try:
            with connection.cursor() as cursor:
                cursor.execute(sql)
                if cursor.description is None:
                    connection.commit()
                    return (
                        f"statement executed ({cursor.statusmessage}); "
                        f"{max(cursor.rowcount, 0)} rows changed"
                    )
                columns = [d.name for d in cursor.description]
                rows = cursor.fetchmany(ROW_CAP + 1)
                if read_only:
                    connection.rollback()
                else:
                    connection.commit()
                return format_rows(columns, rows[:ROW_CAP], len(rows) > ROW_CAP)
        except psycopg.Error as exc:
            raise SqlError(f"PostgreSQL error: {str(exc).strip()}") from exc
        finally:
            connection.close()

    return control.call(work, on_stop=connection.cancel_safe)


class _Timer:
    """Calls ``action`` after ``seconds`` unless cancelled (SQLite has no statement
    timeout of its own)."""

    def __init__(self, seconds: float, action: Any) -> None:
        import threading

        self._timer = threading.Timer(seconds, action)
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        """Do not call the action."""
        self._timer.cancel()
