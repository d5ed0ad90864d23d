"""The live schema of a datasource: tables and views, their columns with types, keys,
comments and row-count estimates, read from the database's own catalog, and the text of
the knowledge entry that describes each (``schema`` entries).

Catalogs: PostgreSQL ``pg_catalog`` (every schema but the system ones, only relations the
user may read; ``reltuples`` is the estimate, an exact count when the table was never
analyzed), MySQL/MariaDB ``information_schema`` of the connected database (``TABLE_ROWS``
is InnoDB's estimate), SQLite ``sqlite_master`` and ``PRAGMA table_info`` /
``foreign_key_list`` (an exact count: SQLite keeps no estimate). Everything is read in a
read-only transaction, each statement within the caller's timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from secrets_vault.connections import database_connection

#: Most tables (and views) harvested from one datasource, and columns described per table.
MAX_TABLES = 2000
MAX_COLUMNS = 400
#: Seconds spent counting rows of tables without an estimate, in all (the rest say
#: "row count unknown").
COUNT_BUDGET_SECONDS = 20.0


@dataclass
class Column:
    """A column: ``name``, ``type`` as the database spells it, ``nullable``,
    ``primary_key``, ``references`` (``table(column)`` of a foreign key) and ``comment``."""

    name: str
    type: str
    nullable: bool = True
    primary_key: bool = False
    references: str = ""
    comment: str = ""


@dataclass
class Table:
    """A table or view: ``name`` as SQL names it (``schema.table`` outside PostgreSQL's
    ``public``), ``kind`` (``table`` | ``view``), ``comment``, ``rows`` (an estimate, or
    None when unknown) and its ``columns``."""

    name: str
    kind: str = "table"
    comment: str = ""
    rows: int | None = None
    columns: list[Column] = field(default_factory=list)

    def entry_title(self) -> str:
        """The knowledge entry's title: the name as it is written in SQL."""
        return self.name

    def entry_text(self) -> str:
        """The knowledge entry's text: a summary line, then one line per column, e.g.::

        Table taxi_trips (about 6,433 rows): New York taxi trips.
        Columns:
        - id bigint, primary key
        - pickup_zone_id integer, not null, references taxi_zones(id): where it began
        """
        size = f"about {self.rows:,} rows" if self.rows is not None else "row count unknown"
        head = f"{self.kind.capitalize()} {self.name} ({len(self.columns)} columns, {size})"
        lines = [head + (f": {self.comment}" if self.comment else ".")]
        lines.append("Columns:")
        for column in self.columns[:MAX_COLUMNS]:
            parts = [f"- {column.name} {column.type}"]
            if column.primary_key:
                parts.append("primary key")
            elif not column.nullable:
                parts.append("not null")
            if column.references:
                parts.append(f"references {column.references}")
            line = ", ".join(parts)
            lines.append(line + (f": {column.comment}" if column.comment else ""))
        if len(self.columns) > MAX_COLUMNS:
            lines.append(f"- … and {len(self.columns) - MAX_COLUMNS} more columns")
        return "\n".join(lines)


def schema_harvest(*, dialect: str, connection: dict[str, Any], timeout: float) -> list[Table]:
    """The tables and views of the database described by *resolved* ``connection``
    settings, by name (at most :data:`MAX_TABLES`). ``timeout``: seconds per statement.

    Raises the driver's exception (or ``connections.ConnectionFailed``) when the database
    cannot be reached or refuses to show its catalog; ``ValueError`` for an unknown dialect.
    """
    harvest = {"postgresql": _postgresql, "mysql": _mysql, "sqlite": _sqlite}.get(dialect)
    if harvest is None:
        raise ValueError(f"unknown dialect {dialect!r}")
    with database_connection(
        dialect=dialect, connection=connection, read_only=True, timeout=timeout
    ) as conn:
        return harvest(conn)


def _rows(conn: Any, sql: str, params: Any = None) -> list[tuple]:
    cursor = conn.cursor()
    try:
        cursor.execute(sql, params) if params is not None else cursor.execute(sql)
        return list(cursor.fetchall())
    finally:
        cursor.close()


class _Counter:
    """Exact row counts for tables without an estimate, within :data:`COUNT_BUDGET_SECONDS`."""

    def __init__(self, conn: Any, *, savepoints: bool) -> None:
        self.conn = conn
        self.savepoints = savepoints  # PostgreSQL: a failed count must not end the transaction
        self.deadline = time.monotonic() + COUNT_BUDGET_SECONDS

    def count(self, quoted_name: str) -> int | None:
        if time.monotonic() > self.deadline:
            return None
        try:
            if self.savepoints:
                with self.conn.transaction():
                    return int(_rows(self.conn, f"SELECT count(*) FROM {quoted_name}")[0][0])  # noqa: S608
            return int(_rows(self.conn, f"SELECT count(*) FROM {quoted_name}")[0][0])  # noqa: S608
        except Exception:  # no right to read it, too slow: the count stays unknown
            return None


def _postgresql(conn: Any) -> list[Table]:
    relations = _rows(
        conn,
        """
        SELECT c.oid, n.nspname, c.relname, c.relkind,
               coalesce(obj_description(c.oid, 'pg_class'), ''), c.reltuples::bigint
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
        return []
    oids = [row[0] for row in relations]
    columns: dict[int, list[Column]] = {oid: [] for oid in oids}
    for oid, name, type_, not_null, comment in _rows(
        conn,
        """
        SELECT a.attrelid, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
               coalesce(col_description(a.attrelid, a.attnum), '')
        FROM pg_attribute a
        WHERE a.attrelid = ANY(%s) AND a.attnum > 0 AND NOT a.attisdropped
        ORDER BY a.attrelid, a.attnum
        """,
        (oids,),
    ):
        columns[oid].append(Column(name=name, type=type_, nullable=not not_null, comment=comment))
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
    counter = _Counter(conn, savepoints=True)
    tables = []
    for oid, schema, name, relkind, comment, estimate in relations:
        qualified = name if schema == "public" else f"{schema}.{name}"
        table = Table(
            name=qualified,
            kind="view" if relkind in ("v", "m") else "table",
            comment=comment,
            columns=columns[oid],
        )
        for column in table.columns:
            column.primary_key = column.name in keys.get(oid, set())
            column.references = references.get((oid, column.name), "")
        if table.kind == "table":
            table.rows = estimate if estimate >= 0 else counter.count(_pg_quoted(schema, name))
        tables.append(table)
    return tables


def _pg_quoted(schema: str, name: str) -> str:
    return ".".join('"' + part.replace('"', '""') + '"' for part in (schema, name))


def _mysql(conn: Any) -> list[Table]:
    tables: dict[str, Table] = {}
    for name, table_type, comment, rows in _rows(
        conn,
        """
        SELECT TABLE_NAME, TABLE_TYPE, TABLE_COMMENT, TABLE_ROWS FROM information_schema.TABLES
        WHERE TABLE_SCHEMA = DATABASE() ORDER BY TABLE_NAME LIMIT %s
        """,
        (MAX_TABLES,),
    ):
        view = "VIEW" in str(table_type).upper()
        tables[name] = Table(
            name=name,
            kind="view" if view else "table",
            # MySQL writes "VIEW" as the comment of a view.
            comment="" if view and comment == "VIEW" else str(comment or ""),
            rows=None if view or rows is None else int(rows),
        )
    references = {
        (table, column): f"{target}({target_column})"
        for table, column, target, target_column in _rows(
            conn,
            """
            SELECT TABLE_NAME, COLUMN_NAME, REFERENCED_TABLE_NAME, REFERENCED_COLUMN_NAME
            FROM information_schema.KEY_COLUMN_USAGE
            WHERE TABLE_SCHEMA = DATABASE() AND REFERENCED_TABLE_NAME IS NOT NULL
            """,
        )
    }
    for table, name, type_, nullable, key, comment in _rows(
        conn,
        """
        SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_KEY, COLUMN_COMMENT
        FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = DATABASE()
        ORDER BY TABLE_NAME, ORDINAL_POSITION
        """,
    ):
        if table in tables:
            tables[table].columns.append(
                Column(
                    name=name,
                    type=str(type_),
                    nullable=nullable == "YES",
                    primary_key=key == "PRI",
                    references=references.get((table, name), ""),
                    comment=str(comment or ""),
                )
            )
    return list(tables.values())


def _sqlite(conn: Any) -> list[Table]:
    counter = _Counter(conn, savepoints=False)
    tables = []
    for name, kind in _rows(
        conn,
        "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
        "AND name NOT LIKE 'sqlite\\_%' ESCAPE '\\' ORDER BY name LIMIT ?",
        (MAX_TABLES,),
    ):
        quoted = '"' + name.replace('"', '""') + '"'
        references = {
            row[3]: f"{row[2]}({row[4]})"
            for row in _rows(conn, f"PRAGMA foreign_key_list({quoted})")
        }
        table = Table(name=name, kind=kind)
        for _cid, column, type_, not_null, _default, pk in _rows(
            conn, f"PRAGMA table_info({quoted})"
        ):
            table.columns.append(
                Column(
                    name=column,
                    type=type_ or "(no type)",
                    nullable=not not_null,
                    primary_key=bool(pk),
                    references=references.get(column, ""),
                )
            )
        if kind == "table":
            table.rows = counter.count(quoted)
        tables.append(table)
    return tables
