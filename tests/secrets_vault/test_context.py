"""What a run on a datasource is given (secrets_vault.context): the tables its SQL needs
come with the docs and examples, found through the examples' SQL, the docs' column names
and foreign keys, within the budget; on a real SQLite database harvested by PAW's own
schema refresh, with PostgreSQL full-text search."""

from __future__ import annotations

import json
import sqlite3

import pytest

from secrets_vault import context
from secrets_vault.models import KnowledgeEntry
from secrets_vault.services.knowledge import (
    datasource_schema_refresh,
    knowledge_entry_create,
    knowledge_for_run,
    tokens_of,
)
from tests.factories import datasource_made

SHOP = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, segment TEXT, currency TEXT);
CREATE TABLE yearmonth (customer_id INTEGER REFERENCES customers(id), date TEXT,
                        consumption REAL, PRIMARY KEY (customer_id, date));
CREATE TABLE gasstations (id INTEGER PRIMARY KEY, chain TEXT, country TEXT, segment TEXT);
CREATE TABLE transactions_1k (id INTEGER PRIMARY KEY, date TEXT,
                              customer_id INTEGER REFERENCES customers(id),
                              gasstation_id INTEGER REFERENCES gasstations(id),
                              amount INTEGER, price REAL);
"""


def shop_source(tmp_path, *, distractors: int = 0):
    """A datasource on a real SQLite file, its schema harvested by PAW's refresh, plus
    ``distractors`` generated tables that share the questions' words."""
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.executescript(SHOP)
        for n in range(distractors):
            db.execute(
                f"CREATE TABLE customer_payment_{n:03d} (id INTEGER PRIMARY KEY, "
                "customer_note TEXT, payment_total REAL, gas_price REAL, year INTEGER)"
            )
    source = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(path)}
    )
    assert datasource_schema_refresh(datasource_id=source.pk, user=None) == 4 + distractors
    return source


def titles(knowledge, kind="schema"):
    return [entry["title"] for entry in knowledge.entries if entry["kind"] == kind]


@pytest.mark.django_db
def test_the_table_only_an_examples_sql_names_is_given(tmp_path, alice, settings):
    """"consumption" is no word of the question: the related example's SQL names the
    table (parsed), so its schema entry comes with it, and the join's other table; in a
    budget that holds a few tables of many."""
    settings.PAW_KNOWLEDGE_CONTEXT_TOKENS = 600
    source = shop_source(tmp_path, distractors=40)
    knowledge_entry_create(
        datasource=source,
        kind="example",
        title="Which customers paid in euros the most in 2012?",
        sql="SELECT c.name FROM customers c JOIN yearmonth y ON y.customer_id = c.id "
        "WHERE c.currency = 'EUR' AND y.date LIKE '2012%' GROUP BY c.name "
        "ORDER BY SUM(y.consumption) DESC",
        user=None,
    )
    question = "Which customer paid in euros the most in 2013?"
    assert "yearmonth" not in [
        hit.entry.title
        for hit in context.knowledge_search(
            datasource_ids=[source.pk], query=question, kinds=("schema",), limit=5
        )
    ]
    knowledge = knowledge_for_run(datasource_slugs=["shop"], prompt=question, user=alice)
    assert {"customers", "yearmonth"} <= set(titles(knowledge))
    assert titles(knowledge, "example") == ["Which customers paid in euros the most in 2012?"]


@pytest.mark.django_db
def test_a_docs_column_names_and_foreign_keys_bring_their_tables(tmp_path, alice, settings):
    settings.PAW_KNOWLEDGE_CONTEXT_TOKENS = 600
    source = shop_source(tmp_path, distractors=40)
    knowledge_entry_create(
        datasource=source,
        kind="doc",
        title="Premium fuel",
        text="premium refers to chain = 'Premium'; a station's sales are its rows.",
        user=None,
    )
    knowledge = knowledge_for_run(
        datasource_slugs=["shop"], prompt="How many premium stations sold fuel?", user=alice
    )
    given = titles(knowledge)
    # "chain" is a column of gasstations only; transactions_1k references it.
    assert given.index("gasstations") < given.index("transactions_1k")
    assert titles(knowledge, "doc") == ["Premium fuel"]


@pytest.mark.django_db
def test_the_context_keeps_its_budget_gives_equal_notes_once_and_never_a_flagged_entry(
    tmp_path, alice, settings
):
    source = shop_source(tmp_path, distractors=120)
    for n in range(3):
        knowledge_entry_create(
            datasource=source,
            kind="doc",
            title=f"Currency note {n}",
            text="EUR and CZK are the currencies of customers.currency.",
            user=None,
        )
    knowledge_entry_create(
        datasource=source,
        kind="doc",
        title="Old currency note",
        text="customers pay in currency DEM.",
        user=None,
    )
    KnowledgeEntry.objects.filter(title="Old currency note").update(flag_reason="outdated")
    for budget in (300, 1000, 4000):
        settings.PAW_KNOWLEDGE_CONTEXT_TOKENS = budget
        knowledge = knowledge_for_run(
            datasource_slugs=["shop"], prompt="customers by currency", user=alice
        )
        spent = sum(
            tokens_of(json.dumps({k: v for k, v in e.items() if k != "id"}, ensure_ascii=False))
            for e in knowledge.entries
        )
        assert 0 < spent <= budget
        docs = titles(knowledge, "doc")
        assert len(docs) == 1 and docs[0].startswith("Currency note")
        assert "customers" in titles(knowledge)
    assert len(knowledge.entries) > 10  # the budget is used, not left empty


@pytest.mark.django_db(transaction=True)
def test_the_schema_map_follows_the_knowledge_version(tmp_path):
    source = shop_source(tmp_path)
    first = context.schema_map([source.pk])
    assert context.schema_map([source.pk]) is first  # cached
    assert first.with_column("consumption") == first.named(source.pk, "yearmonth")
    [customers] = first.named(source.pk, "customers")
    referencing = first.referenced[(source.pk, "customers")]
    assert set(referencing) == set(first.named(source.pk, "yearmonth")) | set(
        first.named(source.pk, "transactions_1k")
    )
    assert customers not in referencing
    knowledge_entry_create(datasource=source, kind="doc", title="n", text="t", user=None)
    assert context.schema_map([source.pk]) is not first
