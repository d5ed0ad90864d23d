"""Datasource knowledge: the staff API for entries (docs and examples checked against the
real database: SQLite, PostgreSQL, MariaDB), the schema refresh harvested by the real
worker from the three databases, failures recorded, what users see, and retrieval
(PostgreSQL full-text, hybrid with the scripted model's embeddings, and an embedded PAW's
SQLite FTS5)."""

from __future__ import annotations

import json
import os
import secrets
import sqlite3
import subprocess
from html.parser import HTMLParser

import pytest

from secrets_vault.embeddings import Embedder
from secrets_vault.models import Datasource, KnowledgeEntry
from secrets_vault.selectors import knowledge_search
from secrets_vault.services import secret_set
from secrets_vault.services.knowledge import (
    IndexSource,
    datasource_schema_refresh,
    knowledge_embed_missing,
    knowledge_entry_create,
    knowledge_for_run,
    knowledge_index_write,
)
from teams.models import Access
from tests.conftest import SCRIPTED_API_KEY
from tests.factories import datasource_made
from tests.live import wait_for
from tests.mariadb import mariadb_settings
from tests.pgdatasource import pg_datasource_connect, pg_datasource_settings
from tests.processes import PYTHON, ROOT, free_port
from tests.secrets_vault.conftest import secret_value

KNOWLEDGE = "/api/admin/datasources/{slug}/knowledge"


@pytest.fixture
def shop_file(tmp_path):
    """A real SQLite file: ``orders`` (3 rows, a key to ``customers``) and a view."""
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL)")
        db.execute(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, day TEXT, total REAL,"
            " customer_id INTEGER REFERENCES customers(id))"
        )
        db.executemany(
            "INSERT INTO orders (day, total) VALUES (?, ?)",
            [("Sat", 20.5), ("Sun", 31.0), ("Sun", 12.25)],
        )
        db.execute("CREATE VIEW totals AS SELECT day, sum(total) AS total FROM orders GROUP BY day")
    return path


@pytest.fixture
def shop(db, shop_file):
    return datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )


@pytest.fixture
def pg_shop():
    """A schema ``paw_knowledge_test`` in the datasource test database (not PAW's own: a
    datasource never is) with two commented tables and a public table ``shop_notes``,
    committed (the worker reads it), dropped afterwards."""
    with pg_datasource_connect() as cursor:
        cursor.execute("DROP SCHEMA IF EXISTS paw_knowledge_test CASCADE")
        cursor.execute("DROP TABLE IF EXISTS public.shop_notes")
        cursor.execute("CREATE TABLE public.shop_notes (id int PRIMARY KEY)")
        cursor.execute("CREATE SCHEMA paw_knowledge_test")
        cursor.execute(
            "CREATE TABLE paw_knowledge_test.customers (id int PRIMARY KEY, name text NOT NULL)"
        )
        cursor.execute(
            "CREATE TABLE paw_knowledge_test.orders (id int PRIMARY KEY, day text,"
            " total numeric(8,2), customer_id int REFERENCES paw_knowledge_test.customers(id))"
        )
        cursor.execute("COMMENT ON TABLE paw_knowledge_test.orders IS 'One row per order'")
        cursor.execute("COMMENT ON COLUMN paw_knowledge_test.orders.total IS 'in euros'")
        cursor.execute("INSERT INTO paw_knowledge_test.customers VALUES (1, 'Ada')")
        cursor.execute(
            "INSERT INTO paw_knowledge_test.orders VALUES (1, 'Sat', 20.5, 1), (2, 'Sun', 3, 1)"
        )
    yield
    with pg_datasource_connect() as cursor:
        cursor.execute("DROP SCHEMA IF EXISTS paw_knowledge_test CASCADE")
        cursor.execute("DROP TABLE IF EXISTS public.shop_notes")


def post_example(client, slug: str, title: str, sql: str):
    """``POST`` an example to the datasource's knowledge; the response."""
    return client.post(
        KNOWLEDGE.format(slug=slug), {"kind": "example", "title": title, "sql": sql}, format="json"
    )


def entries(datasource: Datasource, kind: str) -> dict[str, KnowledgeEntry]:
    return {e.title: e for e in KnowledgeEntry.objects.filter(datasource=datasource, kind=kind)}


# --- The staff API ------------------------------------------------------------------------


def test_the_knowledge_api_is_staff_only(alice_api, shop):
    assert alice_api.get(KNOWLEDGE.format(slug="shop")).status_code == 403
    created = alice_api.post(
        KNOWLEDGE.format(slug="shop"), {"kind": "doc", "title": "t", "text": "x"}, format="json"
    )
    assert created.status_code == 403
    assert alice_api.post("/api/admin/datasources/shop/refresh-schema").status_code == 403
    assert not KnowledgeEntry.objects.exists()


def test_operators_add_edit_list_and_delete_docs_and_examples(operator_client, shop):
    url = KNOWLEDGE.format(slug="shop")
    doc = operator_client.post(
        url, {"kind": "doc", "title": "Money", "text": "Totals are in **EUR**."}, format="json"
    )
    assert doc.status_code == 201, doc.json()
    assert set(doc.json()) == {
        "id", "kind", "title", "text", "sql", "flag_reason", "stale_error", "stale_since",
        "checked_at", "verified_by", "verified_at", "verified_version", "created_at",
        "updated_at",
    }  # fmt: skip
    assert doc.json()["flag_reason"] == ""
    example = post_example(
        operator_client, "shop", "Total per day", "SELECT day, sum(total) FROM orders GROUP BY day"
    )
    assert example.status_code == 201, example.json()
    listed = operator_client.get(url).json()
    assert listed["count"] == 2 and [e["kind"] for e in listed["results"]] == ["doc", "example"]
    assert [
        e["title"] for e in operator_client.get(url, {"kind": "example"}).json()["results"]
    ] == ["Total per day"]
    entry_url = f"{url}/{doc.json()['id']}"
    changed = operator_client.patch(entry_url, {"text": "Totals are in USD."}, format="json")
    assert changed.status_code == 200 and changed.json()["text"] == "Totals are in USD."
    assert operator_client.get(entry_url).json()["text"] == "Totals are in USD."
    assert operator_client.delete(entry_url).status_code == 204
    assert operator_client.get(entry_url).status_code == 404
    assert operator_client.get(KNOWLEDGE.format(slug="nope")).status_code == 404


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"kind": "schema", "title": "orders", "text": "made up"}, "schema_is_harvested"),
        ({"kind": "example", "title": "No SQL"}, "sql_required"),
        ({"kind": "doc", "title": "With SQL", "text": "x", "sql": "SELECT 1"}, "sql_not_allowed"),
        ({"kind": "doc", "title": "Empty"}, "text_required"),
        ({"kind": "doc", "title": "x", "text": "y", "colour": "red"}, "unknown_field"),
    ],
)
def test_bad_entries_are_refused_and_nothing_is_stored(operator_client, shop, body, code):
    response = operator_client.post(KNOWLEDGE.format(slug="shop"), body, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == code, response.json()
    assert not KnowledgeEntry.objects.exists()


@pytest.mark.parametrize(
    ("sql", "code", "error"),
    [
        ("SELECT price FROM orders", "example_failed", "no such column: price"),
        ("DELETE FROM orders", "example_not_a_read", "must be one read"),
        ("SELECT * FROM orders; DELETE FROM orders", "example_not_a_read", "must be one read"),
    ],
)
def test_an_example_is_run_read_only_on_sqlite_and_refused_with_the_databases_error(
    operator_client, shop, shop_file, sql, code, error
):
    response = post_example(operator_client, "shop", "q", sql)
    assert response.status_code == 400
    assert response.json()["code"] == code
    assert error in response.json()["detail"], response.json()
    assert not KnowledgeEntry.objects.exists()
    with sqlite3.connect(shop_file) as db:
        assert db.execute("SELECT count(*) FROM orders").fetchone()[0] == 3


def test_an_sqlite_example_never_attaches_a_file_from_the_web_process(
    operator_client, shop, tmp_path
):
    evil = tmp_path / "evil.db"
    for sql in (
        f"ATTACH DATABASE '{evil}' AS e",
        f"VACUUM INTO '{evil}'",
        "SELECT load_extension('/nowhere/x')",
    ):
        response = post_example(operator_client, "shop", "q", sql)
        assert response.status_code == 400 and response.json()["code"] == "example_not_a_read"
        assert not evil.exists(), sql
    assert not KnowledgeEntry.objects.exists()


def test_an_examples_changed_sql_is_checked_again(operator_client, shop):
    url = KNOWLEDGE.format(slug="shop")
    example = post_example(operator_client, "shop", "Orders", "SELECT * FROM orders").json()
    bad = operator_client.patch(
        f"{url}/{example['id']}", {"sql": "SELECT * FROM nowhere"}, format="json"
    )
    assert bad.status_code == 400 and "no such table: nowhere" in bad.json()["detail"]
    assert KnowledgeEntry.objects.get().sql == "SELECT * FROM orders"


@pytest.mark.django_db(transaction=True)  # the check's own connection sees the tables
def test_examples_are_checked_on_postgresql_read_only(operator_client, pg_shop):
    secret_set(name="PG_PW", value=secret_value("pg"))
    datasource_made(
        slug="pg", name="PG", dialect="postgresql", read_only=False,
        # A writable datasource, as a user that may write: the read-only transaction of an
        # example's check is what stops a write below.
        connection={**pg_datasource_settings(reader=False), "password": "{secret:PG_PW}"},
    )  # fmt: skip
    good = post_example(
        operator_client, "pg", "Sales", "SELECT sum(total) FROM paw_knowledge_test.orders"
    )
    assert good.status_code == 201, good.json()
    # A write is refused before it reaches the database (run_sql's rule of a read)...
    write = post_example(
        operator_client, "pg", "Oops", "DELETE FROM paw_knowledge_test.orders RETURNING id"
    )
    assert write.status_code == 400 and write.json()["code"] == "example_not_a_read"
    # ... a function off the allow-list too (nextval changes a sequence) ...
    bump = post_example(operator_client, "pg", "Bump", "SELECT nextval('paw_knowledge_test.ids')")
    assert bump.status_code == 400 and bump.json()["code"] == "example_not_a_read"
    assert bump.json()["check"] == "function" and "nextval()" in bump.json()["detail"]
    # ... and a writable datasource's example still runs in a read-only transaction: a view
    # that changes a sequence is a read by the parser's rule, which the database refuses.
    with pg_datasource_connect() as db:
        db.execute("CREATE SEQUENCE paw_knowledge_test.ids")
        db.execute(
            "CREATE VIEW paw_knowledge_test.next_id AS SELECT nextval('paw_knowledge_test.ids')"
        )
    bump = post_example(operator_client, "pg", "Bump", "SELECT * FROM paw_knowledge_test.next_id")
    assert bump.status_code == 400 and bump.json()["code"] == "example_failed"
    assert "read-only transaction" in bump.json()["detail"]
    with pg_datasource_connect() as cursor:
        count = cursor.execute("SELECT count(*) FROM paw_knowledge_test.orders").fetchone()
        assert count[0] == 2


def test_examples_are_checked_on_mariadb_read_only(operator_client, mariadb):
    datasource_made(
        slug="maria", name="Maria", dialect="mysql", read_only=False, connection=mariadb_settings()
    )
    good = post_example(operator_client, "maria", "Sales", "SELECT SUM(total) FROM shop_orders")
    assert good.status_code == 201, good.json()
    write = post_example(operator_client, "maria", "Oops", "DELETE FROM shop_orders")
    assert write.status_code == 400 and write.json()["code"] == "example_not_a_read"
    slow_sql = (
        "SELECT count(*) FROM information_schema.collations AS a, "
        "information_schema.collations AS b, information_schema.collations AS c, "
        "information_schema.collations AS d"
    )  # a read of some 10^10 rows: hours
    slow = post_example(operator_client, "maria", "Slow", slow_sql)
    assert slow.status_code == 400 and "max_statement_time" in slow.json()["detail"]


def test_a_mariadb_example_never_writes_a_file_on_the_server(operator_client, mariadb):
    datasource_made(
        slug="maria", name="Maria", dialect="mysql", read_only=False, connection=mariadb_settings()
    )
    target = f"/tmp/paw-outfile-{secrets.token_hex(8)}"
    for sql in (f"SELECT 1 INTO OUTFILE '{target}'", f"SELECT 1 INTO DUMPFILE '{target}'"):
        response = post_example(operator_client, "maria", "Out", sql)
        assert response.status_code == 400 and response.json()["code"] == "example_not_a_read"
    read_back = post_example(operator_client, "maria", "Back", f"SELECT LOAD_FILE('{target}')")
    assert read_back.status_code == 400 and read_back.json()["code"] == "example_not_a_read"
    assert not os.path.exists(target)
    assert not KnowledgeEntry.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_postgresql_example_never_runs_a_program_or_signals_a_backend(operator_client, pg_shop):
    datasource_made(
        slug="pg", name="PG", dialect="postgresql", read_only=False,
        connection=pg_datasource_settings(reader=False),  # the superuser: COPY TO PROGRAM would run
    )  # fmt: skip
    marker = f"/tmp/paw-program-{secrets.token_hex(8)}"
    for sql in (
        f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'",
        "SELECT pg_cancel_backend(0)",
        "SELECT pg_catalog.pg_terminate_backend(0)",
        'SELECT "pg_cancel_backend"(0)',
        f"SELECT lo_export(0, '{marker}')",
    ):
        response = post_example(operator_client, "pg", "Prog", sql)
        assert response.status_code == 400, sql
        assert response.json()["code"] == "example_not_a_read", (sql, response.json())
    assert not os.path.exists(marker)
    assert not KnowledgeEntry.objects.exists()


def test_users_see_docs_examples_and_a_summary_of_the_schema(alice_api, shop):
    knowledge_entry_create(datasource=shop, kind="doc", title="Money", text="EUR", user=None)
    datasource_schema_refresh(datasource_id=shop.pk, user=None)
    shown = alice_api.get("/api/datasources/shop")
    assert shown.status_code == 200
    body = shown.json()
    assert set(body) == {"slug", "name", "description", "dialect", "schema", "docs", "examples"}
    assert [d["title"] for d in body["docs"]] == ["Money"]
    assert {t["name"]: t["summary"] for t in body["schema"]["tables"]} == {
        "customers": "Table customers (2 columns, about 0 rows).",
        "orders": "Table orders (4 columns, about 3 rows).",
        "totals": "View totals (2 columns, row count unknown).",
    }
    assert "connection" not in json.dumps(body) and "sqlite3" not in json.dumps(body)
    shop.enabled = False
    shop.save()
    assert alice_api.get("/api/datasources/shop").status_code == 404


# --- The schema refresh, on the real worker --------------------------------------------------


def refresh_through_the_api(client, slug: str) -> Datasource:
    before = Datasource.objects.get(slug=slug)
    response = client.post(f"/api/admin/datasources/{slug}/refresh-schema")
    assert response.status_code == 202, response.json()
    assert response.json()["schema_requested_at"]
    return wait_for(
        lambda: (
            (d := Datasource.objects.get(slug=slug)).knowledge_version != before.knowledge_version
            or (d.schema_error != before.schema_error and d)
        ),
        timeout=60,
        what="the worker's schema refresh",
    ) and Datasource.objects.get(slug=slug)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_worker_harvests_sqlite_postgresql_and_mariadb_schemas(
    make_client, celery_worker, shop_file, pg_shop, mariadb
):
    from django.contrib.auth import get_user_model

    operator = get_user_model().objects.create_superuser("op", password=None)
    client = make_client(operator)
    secret_set(name="PG_PW", value=secret_value("pg"), user=operator)  # the operator's own
    datasource_made(
        slug="file", name="File", dialect="sqlite", connection={"database": str(shop_file)}
    )
    datasource_made(
        slug="pg", name="PG", dialect="postgresql",
        connection={**pg_datasource_settings(), "password": "{secret:PG_PW}"},
    )  # fmt: skip
    datasource_made(slug="maria", name="Maria", dialect="mysql", connection=mariadb_settings())

    sqlite_source = refresh_through_the_api(client, "file")
    assert sqlite_source.schema_error == "" and sqlite_source.schema_refreshed_at
    tables = entries(sqlite_source, "schema")
    assert set(tables) == {"customers", "orders", "totals"}
    assert tables["orders"].text == (
        "Table orders (4 columns, about 3 rows).\nColumns:\n- id INTEGER, primary key\n"
        "- day TEXT\n- total REAL\n- customer_id INTEGER, references customers(id)"
    )

    pg = refresh_through_the_api(client, "pg")
    assert pg.schema_error == ""
    pg_tables = entries(pg, "schema")
    assert pg_tables["paw_knowledge_test.orders"].text == (
        "Table paw_knowledge_test.orders (4 columns, about 2 rows): One row per order\n"
        "Columns:\n- id integer, primary key\n- day text\n- total numeric(8,2): in euros\n"
        "- customer_id integer, references paw_knowledge_test.customers(id)"
    )
    # Every schema the user may read: public's tables go by their bare name.
    assert "paw_knowledge_test.customers" in pg_tables and "shop_notes" in pg_tables

    maria = refresh_through_the_api(client, "maria")
    assert maria.schema_error == ""
    maria_tables = entries(maria, "schema")
    assert set(maria_tables) == {"shop_customers", "shop_orders", "shop_totals"}
    orders = maria_tables["shop_orders"].text
    assert (
        orders.startswith("Table shop_orders (4 columns, about ")
        and ": One row per order" in orders
    )
    assert "- total decimal(8,2): in euros" in orders
    assert "- customer_id int(11), references shop_customers(id)" in orders
    assert maria_tables["shop_totals"].text.startswith(
        "View shop_totals (2 columns, row count unknown)"
    )

    # A refresh replaces the schema entries at once: a dropped table is gone, a doc stays.
    knowledge_entry_create(
        datasource=sqlite_source, kind="doc", title="Money", text="EUR", user=None
    )
    with sqlite3.connect(shop_file) as db:
        db.execute("DROP VIEW totals")
    again = refresh_through_the_api(client, "file")
    assert set(entries(again, "schema")) == {"customers", "orders"}
    assert set(entries(again, "doc")) == {"Money"}


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_failed_refresh_is_recorded_with_the_databases_error_and_keeps_the_entries(
    make_client, celery_worker, mariadb
):
    from django.contrib.auth import get_user_model

    client = make_client(get_user_model().objects.create_superuser("op", password=None))
    source = datasource_made(
        slug="maria", name="Maria", dialect="mysql", connection=mariadb_settings()
    )
    refreshed = refresh_through_the_api(client, "maria")
    kept = set(entries(refreshed, "schema"))
    assert kept
    password = secret_value("maria-pw")
    secret_set(name="MARIA_WRONG", value=password)
    source.connection = {
        **mariadb_settings(),
        "database": "paw_no_such_db",
        "password": "{secret:MARIA_WRONG}",
    }
    source.save()
    failed = refresh_through_the_api(client, "maria")
    assert failed.schema_error.startswith("Schema refresh failed: "), failed.schema_error
    assert "Access denied" in failed.schema_error or "Unknown database" in failed.schema_error
    assert password not in failed.schema_error
    assert set(entries(failed, "schema")) == kept
    shown = client.get("/api/admin/datasources/maria").json()
    assert shown["schema_error"] == failed.schema_error
    source.connection = {**mariadb_settings(), "port": free_port()}
    source.save()
    down = refresh_through_the_api(client, "maria")
    assert "Can't connect" in down.schema_error, down.schema_error


# --- Retrieval ----------------------------------------------------------------------------------


def warehouse(db_ready=True) -> Datasource:
    source = Datasource.objects.create(
        slug="wh", name="Warehouse", dialect="sqlite", access=Access.EVERYONE
    )
    rows = [
        (
            "schema",
            "titanic_passengers",
            "Table titanic_passengers: survived (1 = lived), class, age, fare",
        ),
        ("schema", "taxi_trips", "Table taxi_trips: pickup, dropoff, distance, fare, tip, borough"),
        (
            "schema",
            "penguins",
            "Table penguins: species, island, bill length, flipper length, body mass",
        ),
        ("doc", "Taxi money", "Fares, tips and tolls of taxi trips are in US dollars."),
    ]
    KnowledgeEntry.objects.bulk_create(
        KnowledgeEntry(datasource=source, kind=kind, title=title, text=text)
        for kind, title, text in rows
    )
    return source


@pytest.mark.django_db
def test_postgresql_full_text_ranks_the_tables_a_question_needs_first():
    source = warehouse()
    hits = knowledge_search(
        datasource_ids=[source.pk], query="What was the average tip of taxi trips?"
    )
    assert [h.entry.title for h in hits] == ["taxi_trips", "Taxi money"]
    flippers = knowledge_search(datasource_ids=[source.pk], query="longest flippers by island")
    assert [h.entry.title for h in flippers] == ["penguins"]
    assert knowledge_search(datasource_ids=[source.pk], query="the of and") == []


@pytest.mark.django_db
def test_hybrid_retrieval_with_the_scripted_embeddings_finds_what_full_text_misses(scripted_model):
    """ "survivors" does not stem like "survived", so full-text misses the table; the
    scripted vectors share its trigrams. The vector matrix is cached per knowledge version."""
    scripted_model.load({"api_key": SCRIPTED_API_KEY})
    source = warehouse()
    embedder = Embedder(
        provider="default",
        base_url=scripted_model.base_url,
        model="scripted-embedding",
        api_key=SCRIPTED_API_KEY,
    )
    assert knowledge_embed_missing(datasource_ids=[source.pk], embedder=embedder) == 4
    assert knowledge_embed_missing(datasource_ids=[source.pk], embedder=embedder) == 0
    question = "how many survivors"
    assert knowledge_search(datasource_ids=[source.pk], query=question) == []
    [vector] = embedder.embed([question])
    hits = knowledge_search(
        datasource_ids=[source.pk],
        query=question,
        query_vector=vector,
        vector_model="scripted-embedding",
    )
    assert hits[0].entry.title == "titanic_passengers"
    # A new entry bumps the version: the next search sees its vector.
    knowledge_entry_create(
        datasource=source, kind="doc", title="Survivors", text="Who survived the sinking", user=None
    )
    knowledge_embed_missing(datasource_ids=[source.pk], embedder=embedder)
    hits = knowledge_search(
        datasource_ids=[source.pk],
        query=question,
        query_vector=vector,
        vector_model="scripted-embedding",
    )
    assert hits[0].entry.title == "Survivors"


@pytest.mark.django_db
def test_a_runs_knowledge_fits_its_token_budget_and_names_its_index(settings, tmp_path, alice):
    source = warehouse()
    settings.PAW_KNOWLEDGE_CONTEXT_TOKENS = 60  # room for one entry
    knowledge = knowledge_for_run(
        datasource_slugs=["wh"], prompt="taxi tips in dollars", user=alice
    )
    # The table the question needs comes before the doc (secrets_vault.context).
    assert [e["title"] for e in knowledge.entries] == ["taxi_trips"]
    source.refresh_from_db()
    [index] = knowledge.sources
    assert index == IndexSource(
        datasource_id=source.pk, slug="wh", version=source.knowledge_version
    )
    assert index.file_name == f"wh.v{source.knowledge_version}.sqlite3"
    knowledge_index_write(source=index, path=tmp_path / index.file_name, vector_model="")
    with sqlite3.connect(tmp_path / index.file_name) as db:
        assert db.execute("SELECT count(*) FROM entries").fetchone()[0] == 4
        assert db.execute(
            "SELECT rowid FROM entries_fts WHERE entries_fts MATCH 'penguins'"
        ).fetchall()
        assert dict(db.execute("SELECT key, value FROM meta"))["version"] == str(index.version)
    settings.PAW_KNOWLEDGE_CONTEXT_TOKENS = 4000
    nothing = knowledge_for_run(datasource_slugs=["wh"], prompt="zzz", user=alice)
    # Nothing matches: the agent still learns the tables.
    assert [e["title"] for e in nothing.entries] == ["penguins", "taxi_trips", "titanic_passengers"]


def test_an_embedded_paw_searches_its_sqlite_database_with_fts5(tmp_path):
    """PAW on SQLite (embedded mode): the migration made the FTS5 table and its triggers;
    inserts, edits and deletes keep it in step."""
    env = {
        "PATH": "/usr/bin:/bin",
        "PAW_DEBUG": "1",
        "PAW_VAR_DIR": str(tmp_path),
        "PAW_DATABASE_URL": f"sqlite:///{tmp_path / 'paw.sqlite3'}",
        "PAW_REDIS_URL": "",
    }
    subprocess.run([PYTHON, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True)
    script = (
        "import json\n"
        "from secrets_vault.models import Datasource, KnowledgeEntry\n"
        "from secrets_vault.selectors import knowledge_search\n"
        "from secrets_vault.services.knowledge import knowledge_entry_update\n"
        "s = Datasource.objects.create(slug='wh', name='W', dialect='sqlite')\n"
        "a = KnowledgeEntry.objects.create(datasource=s, kind='doc', title='Taxi money', text='fares in dollars')\n"
        "b = KnowledgeEntry.objects.create(datasource=s, kind='doc', title='Penguins', text='flipper lengths')\n"
        "found = lambda q: [h.entry.title for h in knowledge_search(datasource_ids=[s.pk], query=q)]\n"
        "out = [found('what fares'), found('flippers')]\n"
        "knowledge_entry_update(entry=b, user=None, text='bill depths')\n"
        "a.delete()\n"
        "out += [found('flippers'), found('bills'), found('fares')]\n"
        "from django.db import connection\n"
        "print(json.dumps([connection.vendor, out]))\n"
    )
    done = subprocess.run(
        [PYTHON, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    vendor, found = json.loads(done.stdout.strip().splitlines()[-1])
    assert vendor == "sqlite"
    assert found == [["Taxi money"], ["Penguins"], [], ["Penguins"], []]


# --- The admin -----------------------------------------------------------------------------


class _FormFields(HTMLParser):
    """The fields a browser would post from the page's main form: inputs (checked boxes
    only), textareas and selected options."""

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, str] = {}
        self._textarea: str | None = None
        self._select: str | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        name = a.get("name")
        if tag == "input" and name and a.get("type") not in ("submit", "button", "file"):
            if a.get("type") != "checkbox" or "checked" in a:
                self.fields[name] = a.get("value", "on" if a.get("type") == "checkbox" else "")
        elif tag == "textarea" and name:
            self._textarea = name
            self.fields[name] = ""
        elif tag == "select" and name:
            self._select = name
        elif tag == "option" and self._select and "selected" in a:
            self.fields[self._select] = a.get("value", "")

    def handle_data(self, data: str) -> None:
        if self._textarea:
            self.fields[self._textarea] += (
                data.removeprefix("\n") if not self.fields[self._textarea] else data
            )

    def handle_endtag(self, tag: str) -> None:
        if tag == "textarea":
            self._textarea = None
        elif tag == "select":
            self._select = None


def change_form(client, datasource: Datasource) -> tuple[str, dict[str, str]]:
    url = f"/admin/secrets_vault/datasource/{datasource.pk}/change/"
    parser = _FormFields()
    parser.feed(client.get(url).content.decode())
    return url, parser.fields


def test_the_admin_shows_the_schema_read_only_and_checks_an_added_example(
    operator_client, shop, shop_file
):
    datasource_schema_refresh(datasource_id=shop.pk, user=None)
    url, fields = change_form(operator_client, shop)
    page = operator_client.get(url).content.decode()
    assert (
        "Knowledge: schema (harvested" in page and "Table orders (4 columns, about 3 rows)." in page
    )
    assert fields["knowledge-TOTAL_FORMS"] == "0"  # no doc nor example yet
    fields.update(
        {
            "knowledge-TOTAL_FORMS": "1",
            "knowledge-0-kind": "example",
            "knowledge-0-title": "Orders per day",
            "knowledge-0-sql": "SELECT day, count(*) FROM orders GROUP BY day",
            "knowledge-0-text": "",
        }
    )
    refused = operator_client.post(url, {**fields, "knowledge-0-sql": "SELECT * FROM nowhere"})
    assert refused.status_code == 200 and "no such table: nowhere" in refused.content.decode()
    assert not KnowledgeEntry.objects.filter(kind="example").exists()
    saved = operator_client.post(url, fields)
    assert saved.status_code == 302, saved.content.decode()[:3000]
    example = KnowledgeEntry.objects.get(kind="example")
    assert example.sql == "SELECT day, count(*) FROM orders GROUP BY day"
    assert set(entries(shop, "schema")) == {"customers", "orders", "totals"}  # untouched
    # The add page has no knowledge yet: an example is checked against a saved datasource.
    add_page = operator_client.get("/admin/secrets_vault/datasource/add/").content.decode()
    assert "knowledge-TOTAL_FORMS" not in add_page


def test_the_admin_refresh_action_queues_a_refresh(operator_client, shop):
    response = operator_client.post(
        "/admin/secrets_vault/datasource/",
        {"action": "refresh_schema", "_selected_action": [shop.pk]},
        follow=True,
    )
    assert "Schema refresh of shop queued" in response.content.decode()
    shop.refresh_from_db()
    assert shop.schema_requested_at is not None
