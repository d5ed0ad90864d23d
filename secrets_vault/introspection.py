"""The live schema of a datasource: tables and views, their columns with types, keys,
comments and row-count estimates, read from the database's own catalog, and the text of
the knowledge entry that describes each (``schema`` entries); with :class:`ValueSampling`,
also the few distinct values of its text columns.

Catalogs: PostgreSQL ``pg_catalog`` (every schema but the system ones, only relations the
user may read; ``reltuples`` is the estimate; a table never analyzed is counted exactly,
but for one whose heap is empty, which has no rows), MySQL/MariaDB ``information_schema``
of the connected database (``TABLE_ROWS`` is InnoDB's estimate), SQLite ``sqlite_master``
and the ``pragma_table_info`` / ``pragma_foreign_key_list`` table functions (an exact
count: SQLite keeps no estimate). Everything is read in a read-only transaction, each
statement within the caller's timeout.

Bounds, whatever the schema's size: at most :data:`MAX_TABLES` tables and
:data:`MAX_COLUMNS` columns each are kept (memory grows with their product at most); the
catalog is read in a few statements (PostgreSQL: one for the relations, then two per
:data:`CATALOG_BATCH` tables; MySQL/MariaDB: three, their rows streamed; SQLite: four),
never one per table; exact counts take :data:`COUNT_BATCH` tables per statement within
:data:`COUNT_BUDGET_SECONDS` in all; values take at most :data:`VALUE_STATEMENT_COLUMNS`
columns per statement within :data:`VALUE_BUDGET_SECONDS` in all.
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ValidationError

from secrets_vault.connections import database_connection
from secrets_vault.masking import mask_text

#: Most tables (and views) harvested from one datasource, and columns described per table.
#: 2,000 stays: a run is shown some 30 tables within its token budget and searches the
#: others, so more tables cost harvest time and memory, not what a run can be shown; the
#: first 2,000 (PostgreSQL: ``public`` first, then by schema and name) are kept and the
#: progress says how many there were.
MAX_TABLES = 2000
MAX_COLUMNS = 400
#: Seconds spent counting rows of tables without an estimate, in all (the rest say
#: "row count unknown").
COUNT_BUDGET_SECONDS = 20.0
#: Tables whose columns and keys one PostgreSQL catalog statement reads, tables one count
#: statement counts, and tables between two progress reports.
CATALOG_BATCH = 250
COUNT_BATCH = 50
PROGRESS_STEP = 100

#: Value sampling (:class:`ValueSampling`): seconds spent in all, and seconds per
#: statement (PostgreSQL ``statement_timeout``, MariaDB ``max_statement_time``, MySQL
#: ``max_execution_time``, SQLite a progress handler).
VALUE_BUDGET_SECONDS = 20.0
VALUE_TIMEOUT = 5.0
#: Tables with more rows than this (by the database's estimate), views and tables of
#: unknown size are not sampled: a column's distinct values need a scan of the table.
VALUE_MAX_TABLE_ROWS = 1_000_000
#: Text columns sampled per table (the first ones, in the table's order); columns per
#: statement, and rows (of the columns' tables, by estimate) one statement may scan.
VALUE_TABLE_COLUMNS = 10
VALUE_STATEMENT_COLUMNS = 20
VALUE_STATEMENT_ROWS = 1_000_000
#: Characters of one value shown (a longer one is cut, ending with "…"), and of a
#: column's list of values (the rest are counted: "… and 12 more").
MAX_VALUE_CHARS = 60
VALUE_LINE_CHARS = 400
#: What separates a column's line from its values in an entry's text.
VALUES_MARK = " — values: "
#: Columns whose values are never sampled whatever the operator says (names matched
#: ignoring case, ``*`` any characters).
ALWAYS_SENSITIVE_COLUMNS = (
    "*password*",
    "*passwd*",
    "*secret*",
    "*token*",
    "*api_key*",
    "*apikey*",
)
#: Most entries of a datasource's ``sensitive_columns``, and characters of one.
MAX_SENSITIVE = 500
MAX_SENSITIVE_CHARS = 300


@dataclass
class Column:
    """A column: ``name``, ``type`` as the database spells it, ``nullable``,
    ``primary_key``, ``references`` (``table(column)`` of a foreign key), ``comment``,
    ``text_like`` (a string or enum type: values may be sampled) and ``values`` (its
    distinct non-null values, sorted and masked, when sampled and at most the sampling's
    limit; None otherwise)."""

    name: str
    type: str
    nullable: bool = True
    primary_key: bool = False
    references: str = ""
    comment: str = ""
    text_like: bool = False
    values: tuple[str, ...] | None = None

    def entry_line(self) -> str:
        """The column's line in its table's entry text, e.g.
        ``- currency text, not null: ISO code — values: 'CZK', 'EUR'``."""
        parts = [f"- {self.name} {self.type}"]
        if self.primary_key:
            parts.append("primary key")
        elif not self.nullable:
            parts.append("not null")
        if self.references:
            parts.append(f"references {self.references}")
        line = ", ".join(parts) + (f": {self.comment}" if self.comment else "")
        return line + (VALUES_MARK + values_text(self.values) if self.values else "")


def values_text(values: Iterable[str]) -> str:
    """Values as SQL string literals, comma-separated (``'CZK', 'EUR'``), each at most
    :data:`MAX_VALUE_CHARS` characters (control characters as spaces), the list at most
    :data:`VALUE_LINE_CHARS` (then ``… and N more``)."""
    shown: list[str] = []
    values = list(values)
    length = 0
    for value in values:
        value = _CONTROL.sub(" ", value)
        if len(value) > MAX_VALUE_CHARS:
            value = value[:MAX_VALUE_CHARS] + "…"
        literal = "'" + value.replace("'", "''") + "'"
        if shown and length + len(literal) + 2 > VALUE_LINE_CHARS:
            break
        shown.append(literal)
        length += len(literal) + 2
    rest = len(values) - len(shown)
    return ", ".join(shown) + (f", … and {rest} more" if rest else "")


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def entry_text_without_values(text: str) -> str:
    """A schema entry's text with every column's values taken out (what the entry says
    when values are not sampled): the part of each column line from :data:`VALUES_MARK`
    on."""
    return "\n".join(
        line.split(VALUES_MARK, 1)[0] if line.startswith("- ") else line
        for line in text.split("\n")
    )


@dataclass
class Table:
    """A table or view: ``name`` as SQL names it (``schema.table`` outside PostgreSQL's
    ``public``), ``kind`` (``table`` | ``view``), ``comment``, ``rows`` (an estimate, or
    None when unknown), its ``columns`` (at most :data:`MAX_COLUMNS`) and
    ``more_columns``, how many more it has."""

    name: str
    kind: str = "table"
    comment: str = ""
    rows: int | None = None
    columns: list[Column] = field(default_factory=list)
    more_columns: int = 0
    # The name quoted for this dialect's SQL (set by the harvest).
    sql_name: str = field(default="", repr=False, compare=False)

    def entry_title(self) -> str:
        """The knowledge entry's title: the name as it is written in SQL."""
        return self.name

    def entry_text(self) -> str:
        """The knowledge entry's text: a summary line, then one line per column, e.g.::

        Table taxi_trips (about 6,433 rows): New York taxi trips.
        Columns:
        - id bigint, primary key
        - pickup_zone_id integer, not null, references taxi_zones(id): where it began
        - payment text — values: 'card', 'cash'
        """
        size = f"about {self.rows:,} rows" if self.rows is not None else "row count unknown"
        count = len(self.columns) + self.more_columns
        head = f"{self.kind.capitalize()} {self.name} ({count} columns, {size})"
        lines = [head + (f": {self.comment}" if self.comment else ".")]
        lines.append("Columns:")
        shown = self.columns[:MAX_COLUMNS]
        lines.extend(column.entry_line() for column in shown)
        if count > len(shown):
            lines.append(f"- … and {count - len(shown)} more columns")
        return "\n".join(lines)

    def column_add(self, column: Column) -> None:
        """Keep ``column`` if the table has fewer than :data:`MAX_COLUMNS`, else count it."""
        if len(self.columns) < MAX_COLUMNS:
            self.columns.append(column)
        else:
            self.more_columns += 1


@dataclass(frozen=True)
class ValueSampling:
    """What a harvest samples of text columns' values: ``limit``, the most distinct
    values a column may have to have them listed (``PAW_KNOWLEDGE_VALUE_SAMPLE``; a
    column with more gets none); ``sensitive``, the operator's names of tables and
    columns whose values are never read (see :class:`SensitiveNames`); and
    ``secret_values`` (``NAME → value``, the datasource's resolved secrets), masked in
    the values recorded as ``masking.mask_text`` masks them."""

    limit: int
    sensitive: tuple[str, ...] = ()
    secret_values: Mapping[str, str] = field(default_factory=dict)


#: ``progress(text)``: told how far a harvest got, e.g. "250 of 1,204 tables read".
Progress = Callable[[str], None]


def schema_harvest(
    *,
    dialect: str,
    connection: dict[str, Any],
    timeout: float,
    values: ValueSampling | None = None,
    progress: Progress | None = None,
) -> list[Table]:
    """The tables and views of the database described by *resolved* ``connection``
    settings, by name (at most :data:`MAX_TABLES`). ``timeout``: seconds per statement.

    ``values``: sample the distinct values of text columns (:func:`_values_sample`: a
    failing or slow statement leaves its columns without values, never fails the
    harvest). ``progress`` is called as it goes, at most every :data:`PROGRESS_STEP`
    tables or once per statement batch, and last with a summary ("1,204 of 1,204 tables
    read; values of 38 columns").

    Raises the driver's exception (or ``connections.ConnectionFailed``) when the database
    cannot be reached or refuses to show its catalog; ``ValueError`` for an unknown dialect.
    """
    harvest = {"postgresql": _postgresql, "mysql": _mysql, "sqlite": _sqlite}.get(dialect)
    if harvest is None:
        raise ValueError(f"unknown dialect {dialect!r}")
    report = _Progress(progress)
    with database_connection(
        dialect=dialect, connection=connection, read_only=True, timeout=timeout
    ) as conn:
        tables, found = harvest(conn, report)
        summary = f"{len(tables):,} of {len(tables):,} tables read"
        if found > len(tables):
            summary += f" (the first {len(tables):,} of {found:,})"
        if values is not None and values.limit > 0:
            sampled = _values_sample(conn, dialect, tables, values, report)
            summary += f"; values of {sampled:,} columns"
        report.say(summary)
        return tables


class _Progress:
    def __init__(self, report: Progress | None) -> None:
        self.report = report
        self.last = 0
        self.what = ""

    def say(self, text: str) -> None:
        if self.report is not None:
            self.report(text)

    def step(self, done: int, total: int, what: str) -> None:
        """Report ``done`` of ``total`` ``what`` once :data:`PROGRESS_STEP` more are done."""
        if what != self.what:
            self.what, self.last = what, 0
        if done - self.last >= PROGRESS_STEP and done < total:
            self.last = done
            self.say(f"{done:,} of {total:,} {what}")


def _rows(conn: Any, sql: str, params: Any = None) -> list[tuple]:
    cursor = conn.cursor()
    try:
        cursor.execute(sql, params) if params is not None else cursor.execute(sql)
        return list(cursor.fetchall())
    finally:
        cursor.close()


def _execute(conn: Any, sql: str) -> None:
    cursor = conn.cursor()
    try:
        cursor.execute(sql)
    finally:
        cursor.close()


def _chunks(items: list, size: int) -> Iterator[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class _Guarded:
    """Statements that may fail (no right to read, too slow) without ending the harvest:
    PostgreSQL in a savepoint, so that the transaction goes on."""

    def __init__(
        self, conn: Any, *, savepoints: bool, statement_seconds: float | None = None
    ) -> None:
        self.conn = conn
        self.savepoints = savepoints
        self.statement_seconds = statement_seconds

    def rows(self, sql: str) -> list[tuple] | None:
        """The rows of ``sql``, or None when it failed (or, with ``statement_seconds``, an
        SQLite connection's statement ran longer: its progress handler stops it)."""
        if self.statement_seconds is not None:
            end = time.monotonic() + self.statement_seconds
            self.conn.set_progress_handler(lambda: int(time.monotonic() > end), 10_000)
        try:
            if self.savepoints:
                with self.conn.transaction():
                    return _rows(self.conn, sql)
            return _rows(self.conn, sql)
        except Exception:  # its columns or counts stay unknown
            return None
        finally:
            if self.statement_seconds is not None:
                self.conn.set_progress_handler(None, 0)


class _Counter:
    """Exact row counts for tables without an estimate, :data:`COUNT_BATCH` per statement,
    within :data:`COUNT_BUDGET_SECONDS` in all."""

    def __init__(self, conn: Any, *, savepoints: bool) -> None:
        self.guarded = _Guarded(conn, savepoints=savepoints)
        self.deadline = time.monotonic() + COUNT_BUDGET_SECONDS

    def count(self, tables: list[Table]) -> None:
        """Set ``rows`` of each of ``tables`` to its count (None when out of time or
        refused: a batch that fails is counted again a table at a time)."""
        for batch in _chunks(tables, COUNT_BATCH):
            counts = self._counts(batch)
            if counts is None and len(batch) > 1:
                counts = [(self._counts([table]) or [None])[0] for table in batch]
            for table, rows in zip(batch, counts or [None] * len(batch), strict=True):
                table.rows = rows

    def _counts(self, tables: list[Table]) -> list[int | None] | None:
        if time.monotonic() > self.deadline:
            return [None] * len(tables)
        # Names quoted by the harvest, as read from the catalog.
        counts = ", ".join(f"(SELECT count(*) FROM {t.sql_name})" for t in tables)  # noqa: S608
        sql = f"SELECT {counts}"
        found = self.guarded.rows(sql)
        return [int(n) for n in found[0]] if found else None


# --- Catalogs -------------------------------------------------------------------------------


def _postgresql(conn: Any, report: _Progress) -> tuple[list[Table], int]:
    relations = _rows(
        conn,
        """
        SELECT c.oid, n.nspname, c.relname, c.relkind,
               coalesce(obj_description(c.oid, 'pg_class'), ''), c.reltuples::bigint,
               CASE WHEN c.reltuples < 0 AND c.relkind = 'r'
                    THEN pg_relation_size(c.oid) END,
               count(*) OVER ()
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE c.relkind IN ('r', 'p', 'v', 'm', 'f') AND NOT c.relispartition
          AND n.nspname NOT IN ('pg_catalog', 'information_schema')
          AND n.nspname NOT LIKE 'pg\\_toast%%' AND n.nspname NOT LIKE 'pg\\_temp%%'
          AND has_table_privilege(c.oid, 'SELECT')
        ORDER BY n.nspname = 'public' DESC, n.nspname, c.relname
        LIMIT %s
        """,
        (MAX_TABLES,),
    )
    if not relations:
        return [], 0
    found = int(relations[0][7])
    tables: dict[int, Table] = {}
    to_count: dict[int, Table] = {}
    for oid, schema, name, relkind, comment, estimate, heap_bytes, _ in relations:
        table = Table(
            name=name if schema == "public" else f"{schema}.{name}",
            kind="view" if relkind in ("v", "m") else "table",
            comment=comment,
            sql_name=_pg_quoted(schema, name),
        )
        if table.kind == "table":
            if estimate >= 0:
                table.rows = estimate
            elif heap_bytes == 0:
                table.rows = 0  # never analyzed, and no page holds a row
            else:
                to_count[oid] = table
        tables[oid] = table
    counter = _Counter(conn, savepoints=True)
    oids = list(tables)
    done = 0
    for batch in _chunks(oids, CATALOG_BATCH):
        _postgresql_columns(conn, tables, batch)
        counter.count([to_count[oid] for oid in batch if oid in to_count])
        done += len(batch)
        if done < len(oids):
            report.say(f"{done:,} of {len(oids):,} tables read")
    return list(tables.values()), found


def _postgresql_columns(conn: Any, tables: dict[int, Table], oids: list[int]) -> None:
    """Columns and keys of the tables ``oids`` (two statements)."""
    keys: dict[int, set[str]] = {}
    references: dict[tuple[int, str], str] = {}
    for oid, kind, local, target, target_columns in _rows(
        conn,
        """
        SELECT con.conrelid, con.contype,
               ARRAY(SELECT a.attname FROM unnest(con.conkey) WITH ORDINALITY k(n, i)
                     JOIN pg_attribute a ON a.attrelid = con.conrelid AND a.attnum = k.n
                     ORDER BY k.i),
               CASE WHEN con.contype = 'f' THEN con.confrelid::regclass::text END,
               ARRAY(SELECT a.attname FROM unnest(con.confkey) WITH ORDINALITY k(n, i)
                     JOIN pg_attribute a ON a.attrelid = con.confrelid AND a.attnum = k.n
                     ORDER BY k.i)
        FROM pg_constraint con
        WHERE con.conrelid = ANY(%s) AND con.contype IN ('p', 'f')
        """,
        (oids,),
    ):
        if kind == "p":
            keys[oid] = set(local)
        elif len(local) == 1 and target:
            references[(oid, local[0])] = f"{target}({', '.join(target_columns)})"
    for oid, name, type_, not_null, comment, category in _rows(
        conn,
        """
        SELECT a.attrelid, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               coalesce(col_description(a.attrelid, a.attnum), ''), t.typcategory
        FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
        WHERE a.attrelid = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attrelid, a.attnum
        """,
        (oids,),
    ):
        tables[oid].column_add(
            Column(
                name=name,
                type=type_,
                nullable=not not_null,
                primary_key=name in keys.get(oid, ()),
                references=references.get((oid, name), ""),
                comment=comment,
                # String types (text, varchar, char, citext...) and enums.
                text_like=category in ("S", "E"),
            )
        )


def _pg_quoted(schema: str, name: str) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in (schema, name))


#: MySQL/MariaDB ``DATA_TYPE``s whose values may be sampled.
_MYSQL_TEXT_TYPES = frozenset(
    {"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"}
)


def _mysql(conn: Any, report: _Progress) -> tuple[list[Table], int]:
    import pymysql.cursors

    tables: dict[str, Table] = {}
    found = 0
    for name, table_type, comment, rows, total in _rows(
        conn,
        """
        SELECT TABLE_NAME, TABLE_TYPE, TABLE_COMMENT, TABLE_ROWS, COUNT(*) OVER ()
        FROM information_schema.TABLES
        WHERE TABLE_SCHEMA = DATABASE() ORDER BY TABLE_NAME LIMIT %s
        """,
        (MAX_TABLES,),
    ):
        found = int(total)
        view = "VIEW" in str(table_type).upper()
        tables[name] = Table(
            name=name,
            kind="view" if view else "table",
            # MySQL writes "VIEW" as the comment of a view.
            comment="" if view and comment == "VIEW" else str(comment or ""),
            rows=None if view or rows is None else int(rows),
            sql_name="`" + name.replace("`", "``") + "`",
        )
    # Streamed (an unbuffered cursor): a schema's keys and columns never wait in memory
    # whole; only the kept tables' columns are.
    references: dict[tuple[str, str], str] = {}
    with contextlib.closing(conn.cursor(pymysql.cursors.SSCursor)) as cursor:
        cursor.execute(
            """
            SELECT TABLE_NAME, COLUMN_NAME, REFERENCED_TABLE_NAME, REFERENCED_COLUMN_NAME
            FROM information_schema.KEY_COLUMN_USAGE
            WHERE TABLE_SCHEMA = DATABASE() AND REFERENCED_TABLE_NAME IS NOT NULL
            """
        )
        for table, column, target, target_column in cursor:
            if table in tables:
                references[(table, column)] = f"{target}({target_column})"
    with contextlib.closing(conn.cursor(pymysql.cursors.SSCursor)) as cursor:
        cursor.execute(
            """
            SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_KEY,
                   COLUMN_COMMENT, DATA_TYPE
            FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
            ORDER BY TABLE_NAME, ORDINAL_POSITION
            """
        )
        for table, name, type_, nullable, key, comment, data_type in cursor:
            if table in tables:
                tables[table].column_add(
                    Column(
                        name=name,
                        type=str(type_),
                        nullable=nullable == "YES",
                        primary_key=key == "PRI",
                        references=references.get((table, name), ""),
                        comment=str(comment or ""),
                        text_like=str(data_type).lower() in _MYSQL_TEXT_TYPES,
                    )
                )
    return list(tables.values()), found


def _sqlite_text_like(declared: str) -> bool:
    """TEXT affinity by SQLite's rules (its manual, "Datatypes", 3.1): no "INT", and
    "CHAR", "CLOB" or "TEXT" in the declared type."""
    upper = declared.upper()
    return "INT" not in upper and any(word in upper for word in ("CHAR", "CLOB", "TEXT"))


_SQLITE_TABLES = (
    "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
    "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name LIMIT ?"
)


def _sqlite(conn: Any, report: _Progress) -> tuple[list[Table], int]:
    found = int(
        _rows(
            conn,
            "SELECT count(*) FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\'",
        )[0][0]
    )
    tables: dict[str, Table] = {}
    references: dict[tuple[str, str], str] = {}
    # Three statements in all, whatever the number of tables: the table functions of the
    # PRAGMAs joined to the list (SQLite 3.16+), their rows read as they come.
    for name, kind in _rows(conn, _SQLITE_TABLES, (MAX_TABLES,)):
        tables[name] = Table(name=name, kind=kind, sql_name='"' + name.replace('"', '""') + '"')
    for table, column, target, target_column in conn.execute(
        f'SELECT m.name, f."from", f."table", f."to" FROM ({_SQLITE_TABLES}) m '  # noqa: S608
        "JOIN pragma_foreign_key_list(m.name) f",
        (MAX_TABLES,),
    ):
        references[(table, column)] = f"{target}({target_column})"
    for table, column, type_, not_null, pk in conn.execute(
        f'SELECT m.name, p.name, p.type, p."notnull", p.pk FROM ({_SQLITE_TABLES}) m '  # noqa: S608
        "JOIN pragma_table_info(m.name) p ORDER BY m.name, p.cid",
        (MAX_TABLES,),
    ):
        tables[table].column_add(
            Column(
                name=column,
                type=type_ or "(no type)",
                nullable=not not_null,
                primary_key=bool(pk),
                references=references.get((table, column), ""),
                text_like=_sqlite_text_like(type_ or ""),
            )
        )
    counter = _Counter(conn, savepoints=False)
    to_count = [table for table in tables.values() if table.kind == "table"]
    for done, batch in enumerate(_chunks(to_count, COUNT_BATCH), 1):
        counter.count(batch)
        report.step(min(done * COUNT_BATCH, len(to_count)), len(to_count), "tables counted")
    return list(tables.values()), found


# --- Sensitive names --------------------------------------------------------------------------


def _glob(pattern: str) -> re.Pattern[str]:
    return re.compile(
        "".join(".*" if part == "*" else re.escape(part) for part in re.split(r"(\*)", pattern)),
        re.IGNORECASE | re.DOTALL,
    )


class SensitiveNames:
    """Which tables and columns are sensitive: named by the operator (``table``,
    ``schema.table``, ``table.column``; ``*`` matches any characters, dots too, so
    ``*.email`` is every table's ``email`` and ``hr.*`` every table of schema ``hr``;
    case is ignored) or by :data:`ALWAYS_SENSITIVE_COLUMNS`. On PostgreSQL a table of
    ``public`` is also matched as ``public.table``. A name that could be a table or a
    column (``a.b``) marks both: a doubt is decided on the side of not reading."""

    def __init__(self, names: Iterable[str], *, dialect: str) -> None:
        self.patterns = [_glob(name) for name in names]
        self.always = [_glob(name) for name in ALWAYS_SENSITIVE_COLUMNS]
        self.public = dialect == "postgresql"

    def _names(self, table: str) -> list[str]:
        return [table, f"public.{table}"] if self.public and "." not in table else [table]

    def table(self, table: str) -> bool:
        """Whether the table ``table`` (as :class:`Table` names it) is sensitive."""
        names = self._names(table)
        return any(p.fullmatch(name) for p in self.patterns for name in names)

    def column(self, table: str, column: str) -> bool:
        """Whether ``column`` of ``table`` is sensitive (its table is, or it is)."""
        if self.table(table) or any(p.fullmatch(column) for p in self.always):
            return True
        names = [f"{name}.{column}" for name in self._names(table)]
        return any(p.fullmatch(name) for p in self.patterns for name in names)


def sensitive_columns_normalized(entries: Any) -> list[str]:
    """A datasource's ``sensitive_columns`` checked and tidied (stripped, each once, in
    order): a list of at most :data:`MAX_SENSITIVE` names of tables or columns (see
    :class:`SensitiveNames`), each 1-:data:`MAX_SENSITIVE_CHARS` characters, without
    control characters or an empty part between dots. Raises Django's ``ValidationError``
    (field ``sensitive_columns``, code ``invalid_sensitive_columns``) naming the first bad
    entry."""

    def refuse(message: str) -> ValidationError:
        return ValidationError({"sensitive_columns": message}, code="invalid_sensitive_columns")

    if not isinstance(entries, list) or len(entries) > MAX_SENSITIVE:
        raise refuse(f"A list of at most {MAX_SENSITIVE} table or table.column names.")
    names: list[str] = []
    for entry in entries:
        name = entry.strip() if isinstance(entry, str) else ""
        if (
            not name
            or len(name) > MAX_SENSITIVE_CHARS
            or _CONTROL.search(name)
            or "" in name.split(".")
        ):
            raise refuse(
                f"{str(entry)[:80]!r} is not a table or table.column name (1-"
                f"{MAX_SENSITIVE_CHARS} characters, '*' for any characters)."
            )
        names.append(name)
    return list(dict.fromkeys(names))


# --- Values ------------------------------------------------------------------------------------


def _values_sample(
    conn: Any, dialect: str, tables: list[Table], sampling: ValueSampling, report: _Progress
) -> int:
    """Set ``values`` of the text columns of ``tables`` that have at most
    ``sampling.limit`` distinct non-null values; returns how many columns got them.

    Sampled: columns of tables (not views) of known size up to
    :data:`VALUE_MAX_TABLE_ROWS` rows, neither sensitive nor of a sensitive table (those
    are never read), :data:`VALUE_TABLE_COLUMNS` per table, each by ``SELECT DISTINCT col
    ... LIMIT limit + 1`` (one more than the limit says "too many"), up to
    :data:`VALUE_STATEMENT_COLUMNS` columns (and :data:`VALUE_STATEMENT_ROWS` rows of
    their tables) in one ``UNION ALL`` statement, each statement within
    :data:`VALUE_TIMEOUT` seconds and all within :data:`VALUE_BUDGET_SECONDS`. A statement
    that fails is tried again a column at a time; a column that still fails, or is not
    reached in time, gets no values."""
    sensitive = SensitiveNames(sampling.sensitive, dialect=dialect)
    wanted: list[tuple[Table, Column]] = []
    for table in tables:
        if table.kind != "table" or table.rows is None or table.rows > VALUE_MAX_TABLE_ROWS:
            continue
        if sensitive.table(table.name):
            continue
        columns = [
            column
            for column in table.columns
            if column.text_like and not sensitive.column(table.name, column.name)
        ]
        wanted.extend((table, column) for column in columns[:VALUE_TABLE_COLUMNS])
    if not wanted:
        return 0
    statements: list[list[tuple[Table, Column]]] = [[]]
    scanned = 0
    for table, column in wanted:
        current = statements[-1]
        if current and (
            len(current) >= VALUE_STATEMENT_COLUMNS
            or scanned + (table.rows or 0) > VALUE_STATEMENT_ROWS
        ):
            statements.append(current := [])
            scanned = 0
        current.append((table, column))
        scanned += table.rows or 0
    guarded = _Guarded(
        conn,
        savepoints=dialect == "postgresql",
        statement_seconds=VALUE_TIMEOUT if dialect == "sqlite" else None,
    )
    _values_timeout(conn, dialect)
    deadline = time.monotonic() + VALUE_BUDGET_SECONDS
    sampled = done = 0
    for group in statements:
        if time.monotonic() > deadline:
            break
        found = guarded.rows(_values_sql(dialect, group, sampling.limit))
        if found is None and len(group) > 1:
            found = []
            for i, pair in enumerate(group):
                if time.monotonic() > deadline:
                    break
                one = guarded.rows(_values_sql(dialect, [pair], sampling.limit))
                found.extend((i, value) for _, value in one or ())
        by_column: dict[int, list[Any]] = {}
        for i, value in found or ():
            by_column.setdefault(int(i), []).append(value)
        for i, (_table, column) in enumerate(group):
            column.values = _values_kept(by_column.get(i, []), sampling)
            sampled += column.values is not None
        done += len(group)
        report.step(done, len(wanted), "columns sampled")
    return sampled


def _values_kept(raw: list[Any], sampling: ValueSampling) -> tuple[str, ...] | None:
    """The values to record of a column's sample, masked and sorted; None when there are
    none, too many, or some are binary."""
    if not raw or len(raw) > sampling.limit:
        return None
    values = []
    for value in raw:
        if isinstance(value, bytes | bytearray | memoryview):
            try:
                value = bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                return None
        text = str(value)
        values.append(mask_text(text, sampling.secret_values) if sampling.secret_values else text)
    return tuple(sorted(set(values)))


def _values_sql(dialect: str, group: list[tuple[Table, Column]], limit: int) -> str:
    """One statement: ``(i, value)`` rows, at most ``limit + 1`` distinct non-null values
    of each ``i``-th column of ``group``."""
    parts = []
    for i, (table, column) in enumerate(group):
        if dialect == "mysql":
            name = "`" + column.name.replace("`", "``") + "`"
            value = "CAST(v AS CHAR)"
        else:
            name = '"' + column.name.replace('"', '""') + '"'
            value = "v::text" if dialect == "postgresql" else "v"
        parts.append(
            f"SELECT {i}, {value} FROM (SELECT DISTINCT {name} AS v FROM {table.sql_name} "  # noqa: S608
            f"WHERE {name} IS NOT NULL LIMIT {int(limit) + 1}) s{i}"
        )
    return " UNION ALL ".join(parts)


def _values_timeout(conn: Any, dialect: str) -> None:
    """Each later statement of a PostgreSQL or MySQL/MariaDB connection within
    :data:`VALUE_TIMEOUT` seconds (SQLite: :class:`_Guarded`'s ``statement_seconds``)."""
    if dialect == "postgresql":
        # Until the read-only transaction ends: sampling is the harvest's last step.
        # (0 would mean no limit: at least a millisecond.)
        _execute(conn, f"SET LOCAL statement_timeout = {max(1, int(VALUE_TIMEOUT * 1000))}")
    elif dialect == "mysql":
        if "mariadb" in str(_rows(conn, "SELECT VERSION()")[0][0]).lower():
            _execute(conn, f"SET SESSION max_statement_time = {max(0.001, VALUE_TIMEOUT)}")
        else:
            _execute(conn, f"SET SESSION max_execution_time = {max(1, int(VALUE_TIMEOUT * 1000))}")
