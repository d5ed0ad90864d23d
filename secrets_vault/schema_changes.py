"""What a schema refresh changed: the harvested structure (tables, their columns and
types) compared with the previous harvest's, from the structure itself, not from the
entries' text.

The structure kept on the datasource (``Datasource.schema_tables``) is
:func:`schema_structure`'s ``{table: {column: type}}``; :func:`schema_diff` compares two.
"""

from __future__ import annotations

from typing import Any

from secrets_vault.introspection import Table


def schema_structure(tables: list[Table]) -> dict[str, dict[str, str]]:
    """``{table name: {column name: type}}`` of harvested ``tables`` (names as SQL writes
    them, types as the database spells them: ``numeric(8,2)``, ``int(11)``)."""
    return {table.name: {column.name: column.type for column in table.columns} for table in tables}


def schema_diff(
    previous: dict[str, dict[str, str]] | None, current: dict[str, dict[str, str]]
) -> dict[str, Any]:
    """What changed from the ``previous`` structure to ``current`` (both as
    :func:`schema_structure` makes them; ``previous`` None or empty: the first harvest).

    Returns ``{"first_harvest": bool, "tables_added": [name], "tables_removed": [name],
    "columns_added": {table: [column]}, "columns_removed": {table: [column]},
    "columns_retyped": {table: [{"column", "from", "to"}]}}``, names sorted; only tables
    present in both are compared column by column (a removed table's columns are not
    listed again). On the first harvest every table is ``tables_added``.
    """
    before = previous or {}
    added = sorted(set(current) - set(before))
    removed = sorted(set(before) - set(current))
    columns_added: dict[str, list[str]] = {}
    columns_removed: dict[str, list[str]] = {}
    columns_retyped: dict[str, list[dict[str, str]]] = {}
    for table in sorted(set(current) & set(before)):
        old, new = before[table], current[table]
        if more := sorted(set(new) - set(old)):
            columns_added[table] = more
        if fewer := sorted(set(old) - set(new)):
            columns_removed[table] = fewer
        retyped = [
            {"column": column, "from": old[column], "to": new[column]}
            for column in sorted(set(old) & set(new))
            if old[column] != new[column]
        ]
        if retyped:
            columns_retyped[table] = retyped
    return {
        "first_harvest": not before,
        "tables_added": added,
        "tables_removed": removed,
        "columns_added": columns_added,
        "columns_removed": columns_removed,
        "columns_retyped": columns_retyped,
    }


def schema_diff_lines(changes: dict[str, Any], *, limit: int = 200) -> list[str]:
    """The changes of a refresh (:func:`schema_diff`'s dict, as stored) as short lines for
    people (``+ table orders``, ``- column orders.total``, ``~ column orders.day: text →
    date``), at most ``limit`` of them (then ``… and N more``); ``[]`` when nothing
    changed. The first harvest is one line."""
    if not changes:
        return []
    if changes.get("first_harvest"):
        return [f"First harvest: {len(changes.get('tables_added') or [])} tables."]
    lines = [f"+ table {name}" for name in changes.get("tables_added") or []]
    lines += [f"- table {name}" for name in changes.get("tables_removed") or []]
    for table, columns in sorted((changes.get("columns_added") or {}).items()):
        lines += [f"+ column {table}.{column}" for column in columns]
    for table, columns in sorted((changes.get("columns_removed") or {}).items()):
        lines += [f"- column {table}.{column}" for column in columns]
    for table, retyped in sorted((changes.get("columns_retyped") or {}).items()):
        lines += [f"~ column {table}.{c['column']}: {c['from']} → {c['to']}" for c in retyped]
    if len(lines) > limit:
        lines = [*lines[:limit], f"… and {len(lines) - limit} more"]
    return lines
