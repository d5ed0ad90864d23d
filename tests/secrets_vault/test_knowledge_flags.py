"""Examples saved under the old rule of a read (regular expressions) that the parser's rule
refuses are flagged by migration 0005, not silently kept: a flagged example is not given
to runs, is shown to operators (in red in the admin) and is cleared by a new SQL that
passes the check."""

from __future__ import annotations

import sqlite3

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from secrets_vault.models import KnowledgeEntry
from secrets_vault.services.knowledge import knowledge_for_run
from tests.factories import datasource_made

KNOWLEDGE = "/api/admin/datasources/{slug}/knowledge"
#: Saved with 201 under the old rule; not reads under the parser's.
OLD_RULE_EXAMPLES = {
    "Host name": "SELECT pg_read_file/**/('/etc/hostname') AS f",
    "Next id": "SELECT nextval('ids')",
    "Hidden": "SELECT name--x\n(1)",
}


@pytest.fixture
def shop_file(tmp_path):
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, day TEXT, total REAL)")
        db.execute("INSERT INTO orders (day, total) VALUES ('Sat', 20.5), ('Sun', 31.0)")
    return path


def _migrate(target: tuple[str, str] | None) -> None:
    """Migrate the test database to ``target``; None: to the newest migrations again."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate([target] if target else executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)  # migrations run outside a test's transaction
def test_the_migration_flags_old_examples_that_are_not_reads_and_keeps_the_reads(shop_file):
    _migrate(("secrets_vault", "0004_custom_provider_vision"))
    try:
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO secrets_vault_datasource (slug, name, description, dialect, "
                "connection, read_only, enabled, allowed_hosts, schema_error, "
                "knowledge_version, created_at, updated_at) VALUES ('old', 'Old', '', "
                "'postgresql', '{}', true, true, '[]', '', 0, now(), now()) RETURNING id"
            )
            datasource_id = cursor.fetchone()[0]
            rows = {**OLD_RULE_EXAMPLES, "Orders per day": "SELECT day, count(*) FROM orders"}
            for title, sql in rows.items():
                cursor.execute(
                    "INSERT INTO secrets_vault_knowledgeentry (datasource_id, kind, title, text, "
                    "sql, vector_model, created_at, updated_at) "
                    "VALUES (%s, 'example', %s, '', %s, '', now(), now())",
                    [datasource_id, title, sql],
                )
    finally:
        _migrate(("secrets_vault", "0005_knowledge_flag_reason"))
    try:
        flags = dict(KnowledgeEntry.objects.values_list("title", "flag_reason"))
    finally:
        # The later migrations again: the transactional tests after this one need them.
        _migrate(None)
    assert flags["Orders per day"] == ""
    assert "calls pg_read_file()" in flags["Host name"]
    assert "calls nextval()" in flags["Next id"]
    assert "calls name()" in flags["Hidden"]
    assert all(f.startswith("Not a read under the parser's rule") for t, f in flags.items() if f)


@pytest.mark.django_db
def test_a_flagged_example_is_kept_from_runs_and_users_until_its_sql_is_fixed(
    operator_client, alice_api, alice, shop_file
):
    shop = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )
    entry = KnowledgeEntry.objects.create(
        datasource=shop,
        kind="example",
        title="Orders per weekday",
        sql="SELECT day, load_extension('x') FROM orders",
        flag_reason="Not a read under the parser's rule of a read: it calls load_extension().",
    )
    given = knowledge_for_run(datasource_slugs=["shop"], prompt="orders per weekday", user=alice)
    assert [e["title"] for e in given.entries] == []
    assert alice_api.get("/api/datasources/shop").json()["examples"] == []
    listed = operator_client.get(KNOWLEDGE.format(slug="shop")).json()["results"]
    assert listed[0]["flag_reason"].startswith("Not a read")
    page = operator_client.get(f"/admin/secrets_vault/datasource/{shop.pk}/change/")
    assert b'class="errornote paw-flag"' in page.content and b"load_extension()" in page.content
    # Editing its text alone keeps the flag; a new SQL that passes the check clears it.
    url = f"{KNOWLEDGE.format(slug='shop')}/{entry.pk}"
    assert operator_client.patch(url, {"text": "by day"}, format="json").status_code == 200
    entry.refresh_from_db()
    assert entry.flag_reason
    fixed = operator_client.patch(
        url, {"sql": "SELECT day, count(*) FROM orders GROUP BY day"}, format="json"
    )
    assert fixed.status_code == 200 and fixed.json()["flag_reason"] == ""
    given = knowledge_for_run(datasource_slugs=["shop"], prompt="orders per weekday", user=alice)
    assert [e["title"] for e in given.entries] == ["Orders per weekday"]
    assert [e["title"] for e in alice_api.get("/api/datasources/shop").json()["examples"]] == [
        "Orders per weekday"
    ]
