"""The tables and columns a statement reads, as the parser places them
(``paw_sqlcheck.references``): joins through aliases, unqualified columns placed by the
schema, CTEs and derived tables down to their base tables, names spelt as the schema
does, and nothing for what does not parse."""

from __future__ import annotations

import pytest

from paw_sqlcheck.references import References, statement_references

SCHEMA = {
    "orders": ["id", "customer_id", "total", "Day"],
    "customers": ["id", "name", "city"],
}


@pytest.mark.parametrize("dialect", ["sqlite", "postgresql", "mysql"])
def test_a_join_through_aliases_reads_both_tables_columns(dialect):
    sql = (
        "SELECT c.name, sum(o.total) AS revenue FROM orders o JOIN customers c "
        "ON c.id = o.customer_id GROUP BY c.name ORDER BY revenue"
    )
    assert statement_references(sql, dialect=dialect) == References(
        tables=["customers", "orders"],
        columns=["customers.id", "customers.name", "orders.customer_id", "orders.total"],
    )


def test_unqualified_columns_of_a_join_are_placed_by_the_schema_or_left_bare():
    sql = "SELECT name, total FROM orders JOIN customers ON customers.id = orders.customer_id"
    placed = statement_references(sql, dialect="sqlite", schema=SCHEMA)
    assert placed.columns == [
        "customers.id",
        "customers.name",
        "orders.customer_id",
        "orders.total",
    ]
    bare = statement_references(sql, dialect="sqlite")
    assert bare.columns == ["customers.id", "name", "orders.customer_id", "total"]


def test_ctes_and_derived_tables_read_their_base_tables_only():
    sql = (
        "WITH big AS (SELECT customer_id, total FROM orders WHERE total > 10) "
        "SELECT q.n FROM (SELECT count(*) AS n FROM big) q"
    )
    assert statement_references(sql, dialect="postgresql") == References(
        tables=["orders"], columns=["orders.customer_id", "orders.total"]
    )


def test_a_single_table_places_its_columns_and_the_schema_spells_names():
    sql = "SELECT day, sum(total) AS s FROM ORDERS GROUP BY day ORDER BY s"
    assert statement_references(sql, dialect="sqlite", schema=SCHEMA) == References(
        tables=["orders"], columns=["orders.Day", "orders.total"]
    )
    star = statement_references("SELECT * FROM customers", dialect="sqlite", schema=SCHEMA)
    assert star.columns == ["customers.city", "customers.id", "customers.name"]


def test_schema_qualified_tables_keep_their_schema():
    sql = "SELECT r.name FROM formula_1.races r WHERE r.year = 2009"
    assert statement_references(sql, dialect="postgresql") == References(
        tables=["formula_1.races"], columns=["formula_1.races.name", "formula_1.races.year"]
    )


@pytest.mark.parametrize(
    "sql", ["", "   ", "SELECT FROM WHERE ((", "SELECT 1; SELECT 2", "x" * 100_001]
)
def test_what_does_not_parse_as_one_statement_reads_nothing(sql):
    assert statement_references(sql, dialect="sqlite") == References()
