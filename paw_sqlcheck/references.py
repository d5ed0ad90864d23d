"""The tables and columns a SQL statement reads, decided by the parser (sqlglot), not by a
pattern: what an answer's lineage names (docs/data.md, "What an answer rests on").

:func:`statement_references` parses one statement for its dialect, qualifies its columns
(sqlglot's ``qualify``: aliases resolved, ``*`` expanded, an unqualified column of a join
placed in its table when ``schema`` says which table has it) and walks its scopes: a table
is a base table the statement names (never a CTE or a derived table), a column is
``table.column`` when its table can be told, else its bare name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from paw_sqlcheck import _SQLGLOT, DIALECTS, MAX_SQL_BYTES

__all__ = ["References", "statement_references"]


@dataclass(frozen=True)
class References:
    """What a statement reads: ``tables`` (``name`` or ``schema.name`` as the statement
    or the schema spells it) and ``columns`` (``table.column``, or ``column`` when its
    table cannot be told), each sorted and without repeats."""

    tables: list[str] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)


def statement_references(
    sql: str, *, dialect: str, schema: Mapping[str, Sequence[str]] | None = None
) -> References:
    """The tables and columns ``sql`` (one statement) reads on ``dialect`` (a PAW dialect
    name: ``postgresql``, ``mysql``/``mariadb``, ``sqlite``). ``schema``: the
    datasource's tables (names as SQL writes them) and their columns, used to place the
    unqualified columns of a join and to spell names as the database does (matched
    ignoring case). A statement that does not parse, is longer than ``MAX_SQL_BYTES`` or
    too deep for the parser reads nothing (empty :class:`References`); never raises for
    bad input."""
    import sqlglot  # loaded on first use, as in judge()
    from sqlglot import exp
    from sqlglot.errors import SqlglotError

    read = _SQLGLOT.get(DIALECTS.get(dialect.lower(), ""), None)
    if not isinstance(sql, str) or not sql.strip() or len(sql.encode()) > MAX_SQL_BYTES:
        return References()
    tables_of = {name.lower(): name for name in (schema or {})}
    columns_of = {
        name.lower(): {column.lower(): column for column in columns}
        for name, columns in (schema or {}).items()
    }
    try:
        trees = [t for t in sqlglot.parse(sql, read=read) if t is not None]
    except (SqlglotError, RecursionError, ValueError):
        return References()
    if len(trees) != 1:
        return References()
    tree = _qualified(trees[0], read, _flat_schema(schema))
    from sqlglot.optimizer.scope import traverse_scope

    tables: set[str] = set()
    columns: set[str] = set()

    def table_name(table: exp.Table) -> str:
        name = ".".join(part for part in (table.catalog, table.db, table.name) if part)
        return tables_of.get(name.lower()) or tables_of.get(table.name.lower()) or name

    def column_name(table: str, column: str) -> str:
        known = columns_of.get(table.lower(), {})
        return f"{table}.{known.get(column.lower(), column)}"

    try:
        scopes = traverse_scope(tree)
    except (SqlglotError, RecursionError, ValueError):
        scopes = []
    if not scopes:  # not a query sqlglot scopes (EXPLAIN …): its tables, unqualified columns
        ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
        for table in tree.find_all(exp.Table):
            if table.name and table.name.lower() not in ctes:
                tables.add(table_name(table))
        columns.update(c.name for c in tree.find_all(exp.Column) if c.name)
        return References(tables=sorted(tables), columns=sorted(columns))
    for scope in scopes:
        bases = {
            alias: source
            for alias, source in scope.sources.items()
            if isinstance(source, exp.Table) and source.name
        }
        tables.update(table_name(source) for source in bases.values())
        only = next(iter(bases.values())) if len(scope.sources) == 1 and bases else None
        for column in scope.columns:
            if not column.name or isinstance(column.this, exp.Star):
                continue
            source = bases.get(column.table) if column.table else only
            if source is not None:
                columns.add(column_name(table_name(source), column.name))
            elif not column.table:
                columns.add(column.name)
            # A column of a CTE or a derived table: its own scope names the base columns.
    return References(tables=sorted(tables), columns=sorted(columns))


def _flat_schema(schema: Mapping[str, Sequence[str]] | None) -> dict[str, dict[str, str]] | None:
    """``schema`` as sqlglot takes it (table → column → type), for the tables named
    without a schema part (sqlglot wants one nesting depth throughout)."""
    if not schema:
        return None
    flat = {
        name: {column: "text" for column in columns}
        for name, columns in schema.items()
        if "." not in name and columns
    }
    return flat or None


def _qualified(tree: Any, read: str | None, schema: dict | None) -> Any:
    """``tree`` with its columns qualified (with ``schema`` when it helps, else without);
    the tree as parsed when sqlglot cannot qualify it."""
    from sqlglot.errors import SqlglotError
    from sqlglot.optimizer.qualify import qualify

    for attempt in (schema, None) if schema else (None,):
        try:
            return qualify(
                tree.copy(),
                schema=attempt,
                dialect=read,
                validate_qualify_columns=False,
                expand_stars=attempt is not None,
                identify=False,
                quote_identifiers=False,
            )
        except (SqlglotError, RecursionError, ValueError, KeyError):
            continue
    return tree
