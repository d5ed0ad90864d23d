"""Verified examples: staff mark an example verified (who, when, against which knowledge
version) over the API and in the admin, only examples, a changed SQL clears it; verified
examples come first among the examples a run is given and are marked in the sandbox's
index file; an answer's SQL matches a verified example as parsed, not as text."""

from __future__ import annotations

import sqlite3

import pytest
from django.contrib.admin.models import LogEntry

from secrets_vault.models import Datasource, KnowledgeEntry
from secrets_vault.selectors import verified_example_matching
from secrets_vault.services.knowledge import (
    IndexSource,
    knowledge_entry_create,
    knowledge_entry_update,
    knowledge_entry_verify,
    knowledge_for_run,
    knowledge_index_write,
)
from tests.factories import datasource_made

KNOWLEDGE = "/api/admin/datasources/{slug}/knowledge"
SALES_PER_DAY = "SELECT day, sum(total) AS total FROM orders GROUP BY day ORDER BY day"


@pytest.fixture
def shop(db, tmp_path):
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, day TEXT, total REAL)")
        connection.executemany(
            "INSERT INTO orders (day, total) VALUES (?, ?)", [("Sat", 20.5), ("Sun", 31.0)]
        )
    return datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(path)}
    )


def example(datasource: Datasource, title: str, sql: str = SALES_PER_DAY) -> KnowledgeEntry:
    return knowledge_entry_create(
        datasource=datasource, kind="example", title=title, sql=sql, user=None
    )


def verify_url(entry: KnowledgeEntry, action: str = "verify") -> str:
    return f"{KNOWLEDGE.format(slug=entry.datasource.slug)}/{entry.pk}/{action}"


# --- Marking verified -----------------------------------------------------------------------


def test_staff_verify_an_example_over_the_api_with_who_when_and_the_knowledge_version(
    operator_client, operator, shop
):
    entry = example(shop, "Sales per day")
    shop.refresh_from_db()
    version = shop.knowledge_version
    response = operator_client.post(verify_url(entry))
    assert response.status_code == 200, response.json()
    body = response.json()
    assert body["verified_by"] == "operator" and body["verified_version"] == version
    assert body["verified_at"] is not None
    entry.refresh_from_db()
    assert entry.verified_by == operator and entry.verified_version == version
    shop.refresh_from_db()
    assert shop.knowledge_version == version + 1  # what runs are given changed
    listed = operator_client.get(KNOWLEDGE.format(slug="shop")).json()["results"]
    assert listed[0]["verified_by"] == "operator"
    assert LogEntry.objects.filter(object_id=str(entry.pk), change_message__contains="verified")
    # Users see when an example was verified.
    [shown] = operator_client.get("/api/datasources/shop").json()["examples"]
    assert shown["verified_at"] == body["verified_at"]

    cleared = operator_client.post(verify_url(entry, "unverify"))
    assert cleared.status_code == 200
    assert cleared.json()["verified_at"] is None and cleared.json()["verified_by"] is None
    entry.refresh_from_db()
    assert (entry.verified_by, entry.verified_at, entry.verified_version) == (None, None, None)


def test_verifying_is_staff_only(alice_api, shop):
    entry = example(shop, "Sales per day")
    assert alice_api.post(verify_url(entry)).status_code == 403
    assert alice_api.post(verify_url(entry, "unverify")).status_code == 403
    entry.refresh_from_db()
    assert entry.verified_at is None


def test_only_examples_can_be_verified(operator_client, shop):
    doc = knowledge_entry_create(
        datasource=shop, kind="doc", title="Money", text="Totals are in EUR.", user=None
    )
    version = Datasource.objects.get(pk=shop.pk).knowledge_version
    response = operator_client.post(verify_url(doc))
    assert response.status_code == 400
    assert response.json()["code"] == "not_an_example"
    assert "Only examples can be verified" in response.json()["detail"]
    doc.refresh_from_db()
    assert doc.verified_at is None
    assert Datasource.objects.get(pk=shop.pk).knowledge_version == version  # nothing changed
    assert operator_client.post(verify_url(doc, "unverify")).json()["code"] == "not_an_example"
    missing = operator_client.post(f"{KNOWLEDGE.format(slug='shop')}/999999/verify")
    assert missing.status_code == 404


def test_a_flagged_example_is_not_verified(operator_client, shop):
    entry = example(shop, "Sales per day")
    KnowledgeEntry.objects.filter(pk=entry.pk).update(flag_reason="not a read")
    response = operator_client.post(verify_url(entry))
    assert response.status_code == 400 and response.json()["code"] == "example_flagged"
    entry.refresh_from_db()
    assert entry.verified_at is None


def test_changing_a_verified_examples_sql_clears_its_verification(operator_client, operator, shop):
    entry = example(shop, "Sales per day")
    knowledge_entry_verify(entry=entry, user=operator)
    # Its title or notes may change: what was verified is the SQL.
    knowledge_entry_update(entry=entry, user=operator, title="Sales by day", text="Per day.")
    entry.refresh_from_db()
    assert entry.verified_at is not None
    changed = operator_client.patch(
        f"{KNOWLEDGE.format(slug='shop')}/{entry.pk}",
        {"sql": "SELECT day, count(*) FROM orders GROUP BY day"},
        format="json",
    )
    assert changed.status_code == 200, changed.json()
    assert changed.json()["verified_at"] is None and changed.json()["verified_version"] is None
    entry.refresh_from_db()
    assert (entry.verified_by, entry.verified_at, entry.verified_version) == (None, None, None)


def test_the_admin_action_verifies_examples_and_refuses_docs(operator_client, operator, shop):
    entry = example(shop, "Sales per day")
    doc = knowledge_entry_create(
        datasource=shop, kind="doc", title="Money", text="Totals are in EUR.", user=None
    )
    page = operator_client.post(
        "/admin/secrets_vault/knowledgeentry/",
        {"action": "mark_verified", "_selected_action": [entry.pk, doc.pk]},
        follow=True,
    ).content.decode()
    assert "Sales per day: verified." in page
    assert "Money: Only examples can be verified; this entry is a doc." in page
    entry.refresh_from_db()
    doc.refresh_from_db()
    assert entry.verified_by == operator and doc.verified_at is None
    listed = operator_client.get("/admin/secrets_vault/knowledgeentry/?verified=yes")
    assert "Sales per day" in listed.content.decode()
    assert "Money" not in listed.content.decode()
    detail = operator_client.get(f"/admin/secrets_vault/knowledgeentry/{entry.pk}/change/")
    assert "by operator on " in detail.content.decode()
    # And on the datasource's page, among its docs and examples.
    datasource_page = operator_client.get(f"/admin/secrets_vault/datasource/{shop.pk}/change/")
    assert "by operator on " in datasource_page.content.decode()
    operator_client.post(
        "/admin/secrets_vault/knowledgeentry/",
        {"action": "clear_verification", "_selected_action": [entry.pk]},
        follow=True,
    )
    entry.refresh_from_db()
    assert entry.verified_at is None
    unverified = operator_client.get("/admin/secrets_vault/knowledgeentry/?verified=no")
    assert "Sales per day" in unverified.content.decode()


# --- What runs are given --------------------------------------------------------------------


def test_verified_examples_come_first_among_a_runs_examples(shop, operator, tmp_path):
    knowledge_entry_create(
        datasource=shop, kind="doc", title="Sales", text="Sales are orders' totals.", user=None
    )
    first = example(shop, "Sales per day", "SELECT day, sum(total) FROM orders GROUP BY day")
    second = example(shop, "Sales per day, largest first", SALES_PER_DAY + " DESC")
    third = example(shop, "Sales of Sunday", "SELECT sum(total) FROM orders WHERE day = 'Sun'")
    prompt = "sales per day"
    before = knowledge_for_run(datasource_slugs=["shop"], prompt=prompt, user=operator).entries
    examples = [e["title"] for e in before if e["kind"] == "example"]
    assert set(examples) == {first.title, second.title, third.title}
    assert not any("verified" in e for e in before)
    # Verify the one ranked last among the examples: it takes the first example's place.
    last = KnowledgeEntry.objects.get(title=examples[-1])
    knowledge_entry_verify(entry=last, user=operator)
    after = knowledge_for_run(datasource_slugs=["shop"], prompt=prompt, user=operator).entries
    assert [e["title"] for e in after if e["kind"] == "example"] == [examples[-1], *examples[:-1]]
    # The other kinds keep their places.
    assert [e["kind"] for e in after] == [e["kind"] for e in before]
    assert [e.get("verified") for e in after if e["kind"] == "example"] == [True, None, None]

    [source] = knowledge_for_run(datasource_slugs=["shop"], prompt=prompt, user=operator).sources
    path = tmp_path / source.file_name
    knowledge_index_write(
        source=IndexSource(datasource_id=shop.pk, slug="shop", version=source.version),
        path=path,
        vector_model="",
    )
    with sqlite3.connect(path) as db:
        rows = dict(db.execute("SELECT title, verified FROM entries"))
    assert rows[examples[-1]] == 1
    assert rows["Sales"] == 0 and sum(rows.values()) == 1


# --- The parsed-SQL match -------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        SALES_PER_DAY,
        SALES_PER_DAY + ";",
        "select DAY, SUM(Total) as total\n  from Orders\n group by day\n order by day ;",
        "SELECT o.day, sum(o.total) total FROM orders o GROUP BY o.day ORDER BY o.day -- per day",
        "SELECT x.day AS day, SUM(x.total) AS total FROM ORDERS AS x GROUP BY 1 ORDER BY 1",
    ],
)
def test_a_reformatted_recased_or_realiased_query_matches_the_verified_example(shop, operator, sql):
    entry = example(shop, "Sales per day")
    knowledge_entry_verify(entry=entry, user=operator)
    assert verified_example_matching(datasource_slug="shop", sql=sql) == entry


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT day, sum(total) AS total FROM orders WHERE day = 'Sun' GROUP BY day ORDER BY day",
        "SELECT day, sum(id) AS total FROM orders GROUP BY day ORDER BY day",
        "SELECT day, sum(total) AS revenue FROM orders GROUP BY day ORDER BY day",
        "SELECT day, sum(total) AS total FROM orders GROUP BY day ORDER BY day DESC",
        "SELECT day, sum(total) AS total FROM orders GROUP BY day ORDER BY day LIMIT 1",
        "DELETE FROM orders",
        "not sql at all",
    ],
)
def test_another_literal_column_alias_or_clause_does_not_match(shop, operator, sql):
    entry = example(shop, "Sales per day")
    knowledge_entry_verify(entry=entry, user=operator)
    assert verified_example_matching(datasource_slug="shop", sql=sql) is None


def test_only_a_verified_example_of_that_datasource_matches(shop, operator, tmp_path):
    entry = example(shop, "Sales per day")
    assert verified_example_matching(datasource_slug="shop", sql=SALES_PER_DAY) is None
    knowledge_entry_verify(entry=entry, user=operator)
    assert verified_example_matching(datasource_slug="shop", sql=SALES_PER_DAY) == entry
    assert verified_example_matching(datasource_slug="other", sql=SALES_PER_DAY) is None
    KnowledgeEntry.objects.filter(pk=entry.pk).update(flag_reason="not a read")
    assert verified_example_matching(datasource_slug="shop", sql=SALES_PER_DAY) is None
