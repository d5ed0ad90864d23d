"""The canonical form of a read (``paw_sqlcheck.canonical.canonical_sql``): what a person
or a model writes differently for the same query has one form; anything that changes
what the query returns keeps its own, in every dialect; what is not one read has none."""

from __future__ import annotations

import pytest

from paw_sqlcheck import MAX_SQL_BYTES
from paw_sqlcheck.canonical import canonical_sql

DIALECTS = ("postgresql", "mysql", "sqlite")
BASE = "SELECT c.name, count(*) AS orders FROM orders o JOIN customers c ON c.id = o.customer_id GROUP BY c.name"

SAME = [
    # Layout, comments, case of keywords and of unquoted names, AS, a semicolon.
    (
        "SELECT day, sum(total) AS total FROM orders GROUP BY day",
        "select DAY,\n  SUM(Total) total -- per day\nFROM orders\nGROUP BY day ;",
    ),
    # Table aliases, with their references, or none.
    (BASE, BASE.replace(" o ", " AS ord ").replace("o.", "ord.").replace(" c ", " cu ").replace("c.", "cu.")),
    (
        "SELECT o.total FROM orders o WHERE o.day = 'Sun'",
        "SELECT total FROM orders WHERE day = 'Sun'",
    ),
    # ORDER BY a position is ORDER BY the projection.
    (
        "SELECT day, count(*) AS n FROM orders GROUP BY day ORDER BY 2 DESC",
        "SELECT day, count(*) AS n FROM orders GROUP BY day ORDER BY count(*) DESC",
    ),
    # Inside a CTE and a derived table too.
    (
        "WITH s AS (SELECT day, total FROM orders) SELECT day, sum(total) AS t FROM s GROUP BY day",
        "with s as (select o.DAY, o.total from orders o) select s.day, sum(s.total) as t from s group by s.day",
    ),
]  # fmt: skip

DIFFERENT = [
    ("SELECT total FROM orders WHERE day = 'Sun'", "SELECT total FROM orders WHERE day = 'Sat'"),
    ("SELECT total FROM orders WHERE id = 1", "SELECT total FROM orders WHERE id = 2"),
    ("SELECT total FROM orders", "SELECT day FROM orders"),
    ("SELECT sum(total) AS total FROM orders", "SELECT sum(total) AS revenue FROM orders"),
    ("SELECT sum(total) FROM orders", "SELECT avg(total) FROM orders"),
    ("SELECT day FROM orders ORDER BY day", "SELECT day FROM orders ORDER BY day DESC"),
    ("SELECT day FROM orders", "SELECT day FROM orders LIMIT 5"),
    ("SELECT day FROM orders", "SELECT day FROM archive.orders"),
    # An output alias named like a column: ORDER BY total is the output, o.total the column.
    (
        "SELECT amount AS total FROM orders ORDER BY total",
        "SELECT amount AS total FROM orders o ORDER BY o.total",
    ),
]


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(("one", "other"), SAME)
def test_the_same_query_written_differently_has_one_form(dialect, one, other):
    form = canonical_sql(one, dialect=dialect)
    assert form is not None
    assert canonical_sql(other, dialect=dialect) == form


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize(("one", "other"), DIFFERENT)
def test_a_different_literal_column_alias_or_clause_has_another_form(dialect, one, other):
    form = canonical_sql(one, dialect=dialect)
    assert form is not None
    assert canonical_sql(other, dialect=dialect) not in (None, form)


def test_table_names_fold_where_the_dialect_folds_them():
    """PostgreSQL and SQLite fold unquoted table names; MySQL and MariaDB keep them (files
    on a case-sensitive file system, by default on Linux)."""
    for dialect in ("postgresql", "sqlite"):
        assert canonical_sql("SELECT id FROM Orders", dialect=dialect) == canonical_sql(
            "SELECT id FROM orders", dialect=dialect
        )
    assert canonical_sql("SELECT id FROM Orders", dialect="mysql") != canonical_sql(
        "SELECT id FROM orders", dialect="mysql"
    )
    assert canonical_sql("SELECT ID FROM `orders`", dialect="mysql") == canonical_sql(
        "SELECT `id` FROM orders", dialect="mysql"
    )


def test_quoted_names_keep_their_case_where_the_dialect_keeps_it():
    assert canonical_sql('SELECT "Total" FROM orders', dialect="postgresql") != canonical_sql(
        "SELECT total FROM orders", dialect="postgresql"
    )
    assert canonical_sql('SELECT "total" FROM orders', dialect="postgresql") == canonical_sql(
        "SELECT Total FROM orders", dialect="postgresql"
    )


@pytest.mark.parametrize(
    "sql",
    [
        "",
        "DELETE FROM orders",
        "SELECT 1; SELECT 2",
        "SELECT * FROM orders FOR UPDATE",
        "not sql",
        "SELECT " + "1 + " * (MAX_SQL_BYTES // 4) + "1",
        "SELECT " + "(" * 200 + "1" + ")" * 200,
    ],
)
def test_what_is_not_one_read_has_no_form(sql):
    assert canonical_sql(sql, dialect="postgresql") is None


def test_an_unknown_dialect_has_no_form():
    assert canonical_sql("SELECT 1", dialect="oracle") is None
