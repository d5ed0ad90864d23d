"""The canonical form of a read: two statements with the same form are the same query.

PAW shows an answer as a *verified query* when its SQL is a verified knowledge example's
(docs/data.md, "Verified examples"). That is compared on the parsed statement, never on
its text: :func:`canonical_sql` undoes what a person or a model writes differently for the
same query, and nothing that changes what it returns:

- formatting, comments, trailing semicolons, the case of keywords, ``AS`` or not, the
  quoting of a string literal where the dialect has two forms (the parser's tree);
- the case of unquoted identifiers, folded as the dialect folds them (a quoted
  ``"Name"`` on PostgreSQL stays itself: sqlglot's ``normalize_identifiers``; MySQL's
  column names, whatever their quotes), and quotes that change nothing (``"total"``);
- table aliases: every table and derived table gets one (its name when it had none) and
  the aliases are renamed ``_t1``, ``_t2`` … in the order they appear, with the column
  references that use them (``FROM orders o … o.id`` is ``FROM orders … orders.id``);
- in a scope that cannot refer to an outer one (the statement itself, a CTE, a derived
  table) and reads one source, an unqualified column is qualified with that source
  (``amount`` is ``o.amount``), unless it may name one of the scope's outputs that is
  not simply that column (``ORDER BY total`` of ``sum(x) AS total``);
- a projection without an alias gets its own name, ``ORDER BY 2`` names the projection
  (sqlglot's ``qualify``).

What is kept: literals (``status = 'paid'`` is not ``status = 'open'``), columns, output
aliases (they name the result's columns), the order of clauses that matter. The rule is
one-sided: the same form must mean the same query; two equivalent queries written very
differently (a join for a subquery) may have different forms, and are then simply not
matched.
"""

from __future__ import annotations

import functools
import re
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.qualify import qualify
from sqlglot.optimizer.scope import Scope, ScopeType, traverse_scope

from paw_sqlcheck import _SQLGLOT, DIALECTS, judge

__all__ = ["canonical_sql"]

_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_$]*")
#: Scopes whose unqualified columns can only be their own sources' (no outer scope).
_CLOSED_SCOPES = frozenset({ScopeType.ROOT, ScopeType.CTE, ScopeType.DERIVED_TABLE})


@functools.lru_cache(maxsize=2048)
def canonical_sql(sql: str, *, dialect: str) -> str | None:
    """The canonical form of ``sql`` on ``dialect`` (``postgresql``, ``mysql``,
    ``sqlite`` or an alias in :data:`paw_sqlcheck.DIALECTS`), as one line of SQL of that
    dialect (see the module docstring); None when ``sql`` is not one read by
    :func:`paw_sqlcheck.judge` (its bounds of size and nesting included) or cannot be
    put in that form. Never raises. Cached per process (statements and dialects are
    strings)."""
    canonical = DIALECTS.get(str(dialect).strip().lower())
    if canonical is None or not judge(sql, dialect=canonical).read:
        return None
    name = _SQLGLOT[canonical]
    try:
        [tree] = [t for t in sqlglot.parse(sql, read=name) if t is not None]
        if canonical == "mysql":
            _fold_mysql_columns(tree)
        tree = qualify(
            tree,
            dialect=name,
            expand_stars=False,
            validate_qualify_columns=False,
            quote_identifiers=False,
            identify=False,
        )
        _qualify_single_sources(tree)
        _rename_table_aliases(tree)
        _unquote_plain_names(tree, canonical)
        return tree.sql(dialect=name, comments=False)
    except RecursionError:
        return None
    except Exception:  # any failure of the parser or the optimizer: no form, no match
        return None


def _fold_mysql_columns(tree: exp.Expression) -> None:
    """MySQL and MariaDB compare column names without case, quoted or not (table names
    keep theirs: they are files on a case-sensitive file system)."""
    for column in tree.find_all(exp.Column):
        if isinstance(column.this, exp.Identifier):
            column.this.set("this", column.this.name.lower())


def _unquote_plain_names(tree: exp.Expression, dialect: str) -> None:
    """Drop the quotes of a plain name where they change nothing: on PostgreSQL and
    SQLite a quoted name already in lower case (``"total"`` is ``total``), on MySQL any
    (quotes there do not change case)."""
    for identifier in tree.find_all(exp.Identifier):
        name = identifier.name
        if not identifier.quoted or not _PLAIN_NAME.fullmatch(name):
            continue
        if dialect == "mysql" or name == name.lower():
            identifier.set("quoted", False)


def _qualify_single_sources(tree: exp.Expression) -> None:
    """Qualify the unqualified columns of each closed scope that reads one source."""
    for scope in traverse_scope(tree):
        if scope.scope_type not in _CLOSED_SCOPES or len(scope.selected_sources) != 1:
            continue
        [source] = scope.selected_sources
        projections, outputs = _projections(scope)
        for column in scope.columns:
            if column.table:
                continue
            # Outside the projections a name may be an output's (ORDER BY total; SQLite
            # even in WHERE): left as written.
            if column.name in outputs and not _within(column, projections):
                continue
            column.set("table", exp.to_identifier(source))


def _projections(scope: Scope) -> tuple[list[exp.Expression], set[str]]:
    """The projections of the scope's SELECT, and the output names that are not simply
    the column of that name (``day AS day`` is the column ``day`` either way)."""
    expression = scope.expression
    if not isinstance(expression, exp.Select):
        return [], set()
    outputs = {
        p.alias_or_name
        for p in expression.expressions
        if not (isinstance(p.unalias(), exp.Column) and p.unalias().name == p.alias_or_name)
    }
    return expression.expressions, outputs


def _within(node: exp.Expression, ancestors: list[exp.Expression]) -> bool:
    ids = {id(a) for a in ancestors}
    current: exp.Expression | None = node
    while current is not None:
        if id(current) in ids:
            return True
        current = current.parent
    return False


def _rename_table_aliases(tree: exp.Expression) -> None:
    """Rename the aliases of tables and derived tables ``_t1``, ``_t2`` … by first
    appearance, and the column qualifiers naming them (one renaming for the whole tree:
    a bijection of names keeps every reference where it was)."""
    renamed: dict[str, str] = {}
    for alias in tree.find_all(exp.TableAlias, bfs=False):
        if not isinstance(alias.parent, exp.Table | exp.Subquery) or not alias.name:
            continue
        new = renamed.setdefault(alias.name, f"_t{len(renamed) + 1}")
        alias.set("this", exp.to_identifier(new))
    column: Any
    for column in tree.find_all(exp.Column, bfs=False):
        if column.table in renamed and not column.args.get("db"):
            column.set("table", exp.to_identifier(renamed[column.table]))
