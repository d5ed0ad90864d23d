"""Values of text columns in the schema entries (the operator's ``sample_values``, at most
``PAW_KNOWLEDGE_VALUE_SAMPLE`` distinct ones), sampled from real SQLite, PostgreSQL and
MariaDB databases; sensitive tables and columns never read nor shown to runs; the switch
off, no values; and a 1,000-table PostgreSQL harvest within its bounds of statements and
memory, with its progress on the datasource."""

from __future__ import annotations

import json
import math
import sqlite3
import tracemalloc

import psycopg
import pytest
from django.db import connection as paw_connection
from django.test.utils import CaptureQueriesContext

from secrets_vault import connections as introspection_connections
from secrets_vault import introspection
from secrets_vault.introspection import VALUES_MARK
from secrets_vault.models import Datasource, KnowledgeEntry
from secrets_vault.services import secret_set
from secrets_vault.services.knowledge import (
    IndexSource,
    datasource_schema_refresh,
    knowledge_for_run,
    knowledge_index_write,
    tokens_of,
)
from tests.factories import datasource_made
from tests.mariadb import mariadb_cursor, mariadb_settings
from tests.pgdatasource import pg_datasource_connect, pg_datasource_settings
from tests.secrets_vault.conftest import secret_value

#: Values that must never be read: of a sensitive column, of a sensitive table, and of a
#: column every datasource treats as sensitive (its name says "token").
NOTE_VALUE = "note-never-shown"
DIAGNOSIS_VALUE = "diagnosis-never-shown"
TOKEN_VALUE = "token-never-shown"
NEVER = (NOTE_VALUE, DIAGNOSIS_VALUE, TOKEN_VALUE)
SENSITIVE = ["cards.note", "patients"]
#: The rows of ``cards``: a currency (few values), a name (more than the limit), a note
#: (sensitive), an access token; and of ``patients`` (a sensitive table).
CARD_ROWS = [
    ("EUR", f"name {i}", NOTE_VALUE, TOKEN_VALUE) if i % 2 else ("CZK", f"name {i}", "x", "y")
    for i in range(40)
]


def sqlite_bank(path) -> None:
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE cards (id INTEGER PRIMARY KEY, currency TEXT NOT NULL, name TEXT,"
            " note TEXT, access_token TEXT, amount REAL)"
        )
        db.executemany(
            "INSERT INTO cards (currency, name, note, access_token) VALUES (?, ?, ?, ?)",
            CARD_ROWS,
        )
        db.execute("CREATE TABLE patients (id INTEGER PRIMARY KEY, diagnosis TEXT)")
        db.execute("INSERT INTO patients (diagnosis) VALUES (?)", (DIAGNOSIS_VALUE,))
        db.execute("CREATE VIEW euro_cards AS SELECT * FROM cards WHERE currency = 'EUR'")


@pytest.fixture
def pg_bank():
    """Schema ``paw_values_test`` in the datasource test database: ``cards`` (an enum
    ``status`` too) and ``patients``, committed, dropped afterwards."""
    with pg_datasource_connect() as conn:
        conn.execute("DROP SCHEMA IF EXISTS paw_values_test CASCADE")
        conn.execute("CREATE SCHEMA paw_values_test")
        conn.execute("CREATE TYPE paw_values_test.status AS ENUM ('open', 'blocked')")
        conn.execute(
            "CREATE TABLE paw_values_test.cards (id serial PRIMARY KEY, currency varchar(3)"
            " NOT NULL, name text, note text, access_token text, amount numeric,"
            " status paw_values_test.status DEFAULT 'open')"
        )
        with conn.cursor() as cursor:
            cursor.executemany(
                "INSERT INTO paw_values_test.cards (currency, name, note, access_token)"
                " VALUES (%s, %s, %s, %s)",
                CARD_ROWS,
            )
        conn.execute(
            "CREATE TABLE paw_values_test.patients (id serial PRIMARY KEY, diagnosis text)"
        )
        conn.execute(
            "INSERT INTO paw_values_test.patients (diagnosis) VALUES (%s)", [DIAGNOSIS_VALUE]
        )
        conn.execute(
            "CREATE VIEW paw_values_test.euro_cards AS"
            " SELECT * FROM paw_values_test.cards WHERE currency = 'EUR'"
        )
        conn.execute("ANALYZE paw_values_test.cards")
    yield
    with pg_datasource_connect() as conn:
        conn.execute("DROP SCHEMA IF EXISTS paw_values_test CASCADE")


@pytest.fixture
def maria_bank(mariadb):
    with mariadb_cursor() as cursor:
        cursor.execute("DROP VIEW IF EXISTS euro_cards")
        cursor.execute("DROP TABLE IF EXISTS cards, patients")
        cursor.execute(
            "CREATE TABLE cards (id INT PRIMARY KEY AUTO_INCREMENT, currency CHAR(3) NOT NULL,"
            " name VARCHAR(100), note TEXT, access_token VARCHAR(100), amount DECIMAL(8,2),"
            " status ENUM('open', 'blocked') DEFAULT 'open')"
        )
        cursor.executemany(
            "INSERT INTO cards (currency, name, note, access_token) VALUES (%s, %s, %s, %s)",
            CARD_ROWS,
        )
        cursor.execute("CREATE TABLE patients (id INT PRIMARY KEY AUTO_INCREMENT, diagnosis TEXT)")
        cursor.execute("INSERT INTO patients (diagnosis) VALUES (%s)", (DIAGNOSIS_VALUE,))
        cursor.execute("CREATE VIEW euro_cards AS SELECT * FROM cards WHERE currency = 'EUR'")
        cursor.execute("ANALYZE TABLE cards, patients")
    yield
    with mariadb_cursor() as cursor:
        cursor.execute("DROP VIEW IF EXISTS euro_cards")
        cursor.execute("DROP TABLE IF EXISTS cards, patients")


def schema_texts(datasource: Datasource) -> dict[str, str]:
    return {
        e.title: e.text
        for e in KnowledgeEntry.objects.filter(
            datasource=datasource, kind=KnowledgeEntry.Kind.SCHEMA
        )
    }


def column_line(text: str, column: str) -> str:
    [line] = [line for line in text.split("\n") if line.startswith(f"- {column} ")]
    return line


def assert_values_but_never_sensitive(datasource: Datasource, prefix: str, user, tmp_path) -> None:
    """What the refresh of a bank datasource must have recorded, and what a run gets."""
    assert datasource_schema_refresh(datasource_id=datasource.pk, user=None)
    datasource.refresh_from_db()
    assert datasource.schema_error == ""
    texts = schema_texts(datasource)
    cards, patients = texts[f"{prefix}cards"], texts[f"{prefix}patients"]
    assert column_line(cards, "currency").endswith(VALUES_MARK + "'CZK', 'EUR'"), cards
    # More distinct values than PAW_KNOWLEDGE_VALUE_SAMPLE (30): none listed.
    assert VALUES_MARK not in column_line(cards, "name")
    # Sensitive: still there by name and type, never with values.
    for column in ("note", "access_token"):
        assert VALUES_MARK not in column_line(cards, column)
    assert VALUES_MARK not in column_line(patients, "diagnosis")
    assert VALUES_MARK not in column_line(cards, "amount")  # not a text column
    assert VALUES_MARK not in texts[f"{prefix}euro_cards"]  # a view is never scanned
    everything = "\n".join(texts.values())
    for value in NEVER:
        assert value not in everything
    assert datasource.schema_progress.endswith(
        f"tables read; values of {everything.count(VALUES_MARK)} columns"
    )

    given = knowledge_for_run(
        datasource_slugs=[datasource.slug],
        prompt="Which currency do cards and patients' diagnosis and notes use?",
        user=user,
    )
    shown = {entry["title"]: entry["text"] for entry in given.entries}
    assert "'EUR'" in shown[f"{prefix}cards"] and f"{prefix}patients" in shown
    for value in NEVER:
        assert value not in repr(given.entries)
    index = tmp_path / "index.sqlite3"
    [source] = given.sources
    knowledge_index_write(source=source, path=index, vector_model="")
    assert all(value.encode() not in index.read_bytes() for value in NEVER)


@pytest.mark.django_db
def test_sqlite_values_are_sampled_but_never_of_sensitive_columns_or_tables(tmp_path, alice):
    sqlite_bank(tmp_path / "bank.sqlite3")
    source = datasource_made(
        slug="bank", name="Bank", dialect="sqlite",
        connection={"database": str(tmp_path / "bank.sqlite3")},
        sample_values=True, sensitive_columns=SENSITIVE,
    )  # fmt: skip
    assert_values_but_never_sensitive(source, "", alice, tmp_path)


@pytest.mark.django_db
def test_postgresql_values_are_sampled_masked_but_never_of_sensitive_columns_or_tables(
    pg_bank, tmp_path, alice
):
    password = secret_value("pg-pw")  # trust authentication: sent, never needed
    secret_set(name="BANK_PW", value=password)
    with pg_datasource_connect() as conn:  # a value that is the datasource's secret
        conn.execute("UPDATE paw_values_test.cards SET status = 'blocked' WHERE id = 1")
        conn.execute("ALTER TABLE paw_values_test.cards ADD COLUMN branch text")
        conn.execute("UPDATE paw_values_test.cards SET branch = %s WHERE id < 3", [password])
        conn.execute("UPDATE paw_values_test.cards SET branch = 'Brno' WHERE id >= 3")
    source = datasource_made(
        slug="bank", name="Bank", dialect="postgresql",
        connection={**pg_datasource_settings(), "password": "{secret:BANK_PW}"},
        sample_values=True, sensitive_columns=["paw_values_test.cards.note", "*.patients"],
    )  # fmt: skip
    assert_values_but_never_sensitive(source, "paw_values_test.", alice, tmp_path)
    cards = schema_texts(source)["paw_values_test.cards"]
    assert column_line(cards, "status").endswith(VALUES_MARK + "'blocked', 'open'")  # an enum
    assert column_line(cards, "branch").endswith(VALUES_MARK + "'Brno', '[secret:BANK_PW]'")
    assert password not in cards


@pytest.mark.django_db
def test_mariadb_values_are_sampled_but_never_of_sensitive_columns_or_tables(
    maria_bank, tmp_path, alice
):
    source = datasource_made(
        slug="bank", name="Bank", dialect="mysql", connection=mariadb_settings(),
        sample_values=True, sensitive_columns=["CARDS.Note", "patients"],  # case is ignored
    )  # fmt: skip
    assert_values_but_never_sensitive(source, "", alice, tmp_path)
    assert column_line(schema_texts(source)["cards"], "status").endswith(VALUES_MARK + "'open'")


@pytest.mark.django_db
def test_without_the_operators_switch_or_with_the_setting_at_zero_no_values(
    tmp_path, settings, alice
):
    sqlite_bank(tmp_path / "bank.sqlite3")
    source = datasource_made(
        slug="bank", name="Bank", dialect="sqlite",
        connection={"database": str(tmp_path / "bank.sqlite3")},
    )  # fmt: skip
    assert source.sample_values is False  # the default
    assert datasource_schema_refresh(datasource_id=source.pk, user=None)
    texts = schema_texts(source)
    assert "- currency TEXT, not null" in texts["cards"]
    assert VALUES_MARK not in "\n".join(texts.values()) and "'EUR'" not in texts["cards"]
    assert Datasource.objects.get(pk=source.pk).schema_progress == "3 of 3 tables read"

    source.sample_values = True
    source.save()
    settings.PAW_KNOWLEDGE_VALUE_SAMPLE = 0
    assert datasource_schema_refresh(datasource_id=source.pk, user=None)
    assert VALUES_MARK not in "\n".join(schema_texts(source).values())

    settings.PAW_KNOWLEDGE_VALUE_SAMPLE = 2  # CZK and EUR: exactly the limit
    assert datasource_schema_refresh(datasource_id=source.pk, user=None)
    assert column_line(schema_texts(source)["cards"], "currency").endswith("'CZK', 'EUR'")
    settings.PAW_KNOWLEDGE_VALUE_SAMPLE = 1  # one fewer than it has: none
    assert datasource_schema_refresh(datasource_id=source.pk, user=None)
    assert VALUES_MARK not in schema_texts(source)["cards"]


@pytest.mark.django_db
def test_operators_set_sampling_over_rest_and_turning_it_off_forgets_the_values_at_once(
    operator_client, tmp_path, alice
):
    sqlite_bank(tmp_path / "bank.sqlite3")
    datasource_made(
        slug="bank", name="Bank", dialect="sqlite",
        connection={"database": str(tmp_path / "bank.sqlite3")},
    )  # fmt: skip
    url = "/api/admin/datasources/bank"
    shown = operator_client.get(url).json()
    assert (shown["sample_values"], shown["sensitive_columns"], shown["schema_progress"]) == (
        False, [], ""
    )  # fmt: skip
    for bad in (["cards..note"], [""], ["a\nb"], "cards", [3], ["x" * 301], ["t"] * 501):
        response = operator_client.patch(url, {"sensitive_columns": bad}, format="json")
        assert response.status_code == 400, (bad, response.json())
        assert response.json()["detail"].startswith("sensitive_columns"), response.json()
    assert Datasource.objects.get(slug="bank").sensitive_columns == []

    response = operator_client.patch(
        url, {"sample_values": True, "sensitive_columns": [" patients ", "patients"]},
        format="json",
    )  # fmt: skip
    assert response.status_code == 200, response.json()
    assert response.json()["sensitive_columns"] == ["patients"]  # stripped, each once
    source = Datasource.objects.get(slug="bank")
    assert datasource_schema_refresh(datasource_id=source.pk, user=None)
    assert "'EUR'" in schema_texts(source)["cards"]
    assert operator_client.get(url).json()["schema_progress"].startswith("3 of 3 tables read")
    version = Datasource.objects.get(slug="bank").knowledge_version

    # Marking a column sensitive takes the values out before any refresh.
    response = operator_client.patch(
        url, {"sensitive_columns": ["patients", "cards.currency"]}, format="json"
    )
    assert response.status_code == 200
    assert VALUES_MARK not in "\n".join(schema_texts(source).values())
    assert "- currency TEXT, not null" in schema_texts(source)["cards"]
    assert Datasource.objects.get(slug="bank").knowledge_version > version
    given = knowledge_for_run(datasource_slugs=["bank"], prompt="card currency", user=alice)
    assert given.entries and "'EUR'" not in repr(given.entries)

    # Switched off: the same.
    operator_client.patch(url, {"sensitive_columns": ["patients"]}, format="json")
    datasource_schema_refresh(datasource_id=source.pk, user=None)
    assert "'EUR'" in schema_texts(source)["cards"]
    assert operator_client.patch(url, {"sample_values": False}, format="json").status_code == 200
    assert VALUES_MARK not in "\n".join(schema_texts(source).values())


@pytest.mark.django_db
def test_the_admin_edits_sampling_and_shows_the_progress(operator_client, tmp_path):
    sqlite_bank(tmp_path / "bank.sqlite3")
    source = datasource_made(
        slug="bank", name="Bank", dialect="sqlite",
        connection={"database": str(tmp_path / "bank.sqlite3")},
    )  # fmt: skip
    datasource_schema_refresh(datasource_id=source.pk, user=None)
    page = operator_client.get(f"/admin/secrets_vault/datasource/{source.pk}/change/")
    html = page.content.decode()
    assert 'name="sample_values"' in html and 'name="sensitive_columns"' in html
    assert "3 of 3 tables read" in html
    listing = operator_client.get("/admin/secrets_vault/datasource/").content.decode()
    assert "3 of 3 tables read" in listing


def test_sensitive_names_match_tables_columns_and_wildcards_ignoring_case():
    names = introspection.SensitiveNames(
        ["patients", "Orders.Note", "*.email", "hr.*", "public.staff"], dialect="postgresql"
    )
    assert names.table("patients") and names.column("patients", "id")
    assert names.column("orders", "note") and not names.column("orders", "total")
    assert names.column("sales.customers", "EMAIL") and not names.column("customers", "emails")
    assert names.table("hr.salaries") and not names.table("hrx.salaries")
    assert names.table("staff")  # public.staff is staff on PostgreSQL
    assert names.column("anything", "db_password") and names.column("t", "API_KEY")
    sqlite_names = introspection.SensitiveNames(["public.staff"], dialect="sqlite")
    assert not sqlite_names.table("staff")


# --- A large schema --------------------------------------------------------------------------

LARGE_TABLES = 1000


@pytest.fixture
def pg_large():
    """Schema ``paw_large_test``: 1,000 tables (a key to the previous one, a text column
    of two values, one row each: never analyzed, so they are counted), and one sensitive
    table among them; dropped afterwards."""
    with pg_datasource_connect() as conn:
        conn.execute("DROP SCHEMA IF EXISTS paw_large_test CASCADE")
        conn.execute("CREATE SCHEMA paw_large_test")
        # One round trip: the tables are made by the server itself.
        conn.execute(
            f"""
            DO $$ BEGIN
            FOR i IN 0..{LARGE_TABLES - 1} LOOP
              EXECUTE format('CREATE TABLE paw_large_test.%I (id int PRIMARY KEY, kind text,'
                             ' amount numeric, parent_id int %s)', 't' || lpad(i::text, 4, '0'),
                             CASE WHEN i > 0 THEN format('REFERENCES paw_large_test.%I(id)',
                                                         't' || lpad((i - 1)::text, 4, '0'))
                             ELSE '' END);
              EXECUTE format('INSERT INTO paw_large_test.%I VALUES (1, %L, 1, NULL),'
                             ' (2, %L, 2, NULL)', 't' || lpad(i::text, 4, '0'),
                             CASE WHEN i % 2 = 1 THEN 'small' ELSE 'large' END,
                             CASE WHEN i = 7 THEN '{DIAGNOSIS_VALUE}' ELSE 'medium' END);
            END LOOP;
            END $$
            """  # noqa: S608 - the test's own names
        )
    yield
    with pg_datasource_connect() as conn:
        conn.execute("DROP SCHEMA IF EXISTS paw_large_test CASCADE")


class StatementCount:
    """Statements sent to one PostgreSQL database (by name), as psycopg sends them: each
    ``execute``, and the savepoint and its release or rollback of each transaction block."""

    def __init__(self, monkeypatch, database: str) -> None:
        self.executes = 0
        self.blocks = 0
        execute, transaction = psycopg.Cursor.execute, psycopg.Connection.transaction
        counter = self

        def counted_execute(cursor, *args, **kwargs):
            if cursor.connection.info.dbname == database:
                counter.executes += 1
            return execute(cursor, *args, **kwargs)

        def counted_transaction(conn, *args, **kwargs):
            if conn.info.dbname == database:
                counter.blocks += 1
            return transaction(conn, *args, **kwargs)

        monkeypatch.setattr(psycopg.Cursor, "execute", counted_execute)
        monkeypatch.setattr(psycopg.Connection, "transaction", counted_transaction)

    @property
    def statements(self) -> int:
        return self.executes + 2 * self.blocks


#: Most bytes a 1,000-table harvest (and the writing of its entries) may allocate at its
#: peak, by tracemalloc: measured at 5.4 MB (the tables with their columns, 1,000 entries
#: and their INSERTs); the bound leaves room for three times that, not for growth with the
#: schema's size going unnoticed. The index file's writing: measured at 1 MB, bound 4 MB.
LARGE_HARVEST_PEAK_BYTES = 16 * 1024 * 1024


@pytest.mark.slow
@pytest.mark.django_db
def test_a_1000_table_postgresql_harvest_stays_within_its_bounds(
    pg_large, monkeypatch, tmp_path, alice
):
    settings = pg_datasource_settings()
    source = datasource_made(
        slug="large", name="Large", dialect="postgresql", connection=settings,
        sample_values=True, sensitive_columns=["paw_large_test.t0007"],
    )  # fmt: skip
    count = StatementCount(monkeypatch, settings["database"])
    tracemalloc.start()
    try:
        with CaptureQueriesContext(paw_connection) as paw_queries:
            harvested = datasource_schema_refresh(datasource_id=source.pk, user=None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert harvested is not None and harvested >= LARGE_TABLES
    source.refresh_from_db()
    assert source.schema_error == ""
    texts = schema_texts(source)
    assert len(texts) == harvested
    assert column_line(texts["paw_large_test.t0500"], "kind").endswith("'large', 'medium'")
    assert "references paw_large_test.t0499(id)" in texts["paw_large_test.t0500"]
    assert VALUES_MARK not in texts["paw_large_test.t0007"]
    assert DIAGNOSIS_VALUE not in "\n".join(texts.values())

    # Statements to the datasource: the relations, two per CATALOG_BATCH tables, counts by
    # COUNT_BATCH tables and values by VALUE_STATEMENT_COLUMNS columns (each in a
    # savepoint), the timeout set for values, and the session's own begin: never one per
    # table.
    sampled = sum(VALUES_MARK in text for text in texts.values())
    assert sampled >= LARGE_TABLES - 1
    batches = math.ceil(harvested / introspection.COUNT_BATCH) + math.ceil(
        sampled / introspection.VALUE_STATEMENT_COLUMNS
    )
    catalog = 1 + 2 * math.ceil(harvested / introspection.CATALOG_BATCH)
    assert count.blocks <= batches
    assert count.executes <= catalog + batches + 1
    assert count.statements <= 3 * batches + catalog + 1 < harvested / 3
    # PAW's side: entries written SCHEMA_WRITE_BATCH at a time, progress a few times.
    inserts = [q for q in paw_queries.captured_queries if q["sql"].startswith("INSERT")]
    assert len(inserts) == math.ceil(harvested / 500)
    progress = [
        q["sql"] for q in paw_queries.captured_queries if 'SET "schema_progress"' in q["sql"]
    ]
    assert len(progress) <= (
        math.ceil(harvested / introspection.CATALOG_BATCH)
        + sampled / introspection.PROGRESS_STEP
        + 1
    )
    assert any(f"250 of {harvested:,} tables read" in sql for sql in progress)
    assert any(" columns sampled" in sql for sql in progress)
    assert source.schema_progress == (
        f"{harvested:,} of {harvested:,} tables read; values of {sampled:,} columns"
    )
    assert peak < LARGE_HARVEST_PEAK_BYTES, peak

    # A run's context stays within its budget; retrieval reads a bounded number of rows.
    from django.conf import settings as django_settings

    for prompt in ("kind and amount of t0500", "nothing matches zyxwvut"):
        with CaptureQueriesContext(paw_connection) as queries:
            given = knowledge_for_run(datasource_slugs=["large"], prompt=prompt, user=alice)
        # What the model reads: the entry without its id (lineage's).
        total = sum(
            tokens_of(json.dumps({k: v for k, v in e.items() if k != "id"}, ensure_ascii=False))
            for e in given.entries
        )
        assert 0 < len(given.entries) <= 100
        assert total <= django_settings.PAW_KNOWLEDGE_CONTEXT_TOKENS
        # The datasources, four searches (docs, examples, tables, the expanded query), the
        # schema map's versions (and, when they changed, its one streamed read of the
        # schema entries), the best tables, the index's versions: none per table.
        assert len(queries.captured_queries) <= 10, [
            q["sql"][:80] for q in queries.captured_queries
        ]
    # The sandbox's index file is written streaming every entry.
    tracemalloc.start()
    try:
        knowledge_index_write(
            source=IndexSource(datasource_id=source.pk, slug="large", version=1),
            path=tmp_path / "large.sqlite3",
            vector_model="",
        )
        index_peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    with sqlite3.connect(tmp_path / "large.sqlite3") as db:
        assert db.execute("SELECT count(*) FROM entries").fetchone()[0] == harvested
    assert index_peak < LARGE_HARVEST_PEAK_BYTES / 4, index_peak


def test_a_1000_table_sqlite_harvest_sends_a_few_dozen_statements(tmp_path, monkeypatch):
    path = tmp_path / "large.sqlite3"
    with sqlite3.connect(path) as db:
        for i in range(LARGE_TABLES):
            parent = f" REFERENCES t{i - 1:04}(id)" if i else ""
            db.execute(f"CREATE TABLE t{i:04} (id INTEGER PRIMARY KEY, kind TEXT, p INT{parent})")
            db.execute(f"INSERT INTO t{i:04} (kind) VALUES ('a'), ('b')")  # noqa: S608
    statements: list[str] = []
    limit = introspection_connections.sqlite_limit

    def traced(conn):  # every statement the harvest's connection runs
        conn.set_trace_callback(statements.append)
        return limit(conn)

    monkeypatch.setattr(introspection_connections, "sqlite_limit", traced)
    said: list[str] = []
    tables = introspection.schema_harvest(
        dialect="sqlite",
        connection={"database": str(path)},
        timeout=30,
        values=introspection.ValueSampling(limit=30),
        progress=said.append,
    )
    assert len(tables) == LARGE_TABLES
    [t0500] = [table for table in tables if table.name == "t0500"]
    assert t0500.entry_text().endswith(
        "- kind TEXT — values: 'a', 'b'\n- p INT, references t0499(id)"
    )
    # SQLite traces what its PRAGMA table functions do inside as "-- PRAGMA ..." lines.
    sent = [s for s in statements if not s.startswith("--")]
    # The list, its count, keys, columns; counts and values by batches.
    assert len(sent) == 4 + LARGE_TABLES // introspection.COUNT_BATCH + (
        LARGE_TABLES // introspection.VALUE_STATEMENT_COLUMNS
    )
    assert said[0] == "100 of 1,000 tables counted" and "500 of 1,000 columns sampled" in said
    assert said[-1] == "1,000 of 1,000 tables read; values of 1,000 columns"


# --- Statements past their time --------------------------------------------------------------


def test_an_sqlite_value_statement_past_its_time_leaves_only_its_columns_without_values(
    tmp_path, monkeypatch
):
    path = tmp_path / "slow.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE big (id INTEGER PRIMARY KEY, kind TEXT)")
        db.executemany(
            "INSERT INTO big (kind) VALUES (?)", [("a" if i % 2 else "b",) for i in range(50_000)]
        )
        db.execute("CREATE TABLE small (id INTEGER PRIMARY KEY, kind TEXT)")
        db.execute("INSERT INTO small (kind) VALUES ('c'), ('d')")
    # No time at all: a statement is stopped at its first progress check (every 10,000
    # instructions), which scanning 50,000 rows reaches and two rows do not.
    monkeypatch.setattr(introspection, "VALUE_TIMEOUT", 0.0)
    tables = {
        t.name: t
        for t in introspection.schema_harvest(
            dialect="sqlite",
            connection={"database": str(path)},
            timeout=30,
            values=introspection.ValueSampling(limit=30),
        )
    }
    assert tables["big"].rows == 50_000 and tables["big"].columns[1].values is None
    assert tables["small"].columns[1].values == ("c", "d")  # tried again on its own


@pytest.fixture
def pg_slow():
    with pg_datasource_connect() as conn:
        conn.execute("DROP SCHEMA IF EXISTS paw_slow_test CASCADE")
        conn.execute("CREATE SCHEMA paw_slow_test")
        conn.execute("CREATE TABLE paw_slow_test.big (id int PRIMARY KEY, kind text)")
        conn.execute(
            "INSERT INTO paw_slow_test.big SELECT i, CASE WHEN i % 2 = 0 THEN 'a' ELSE 'b' END"
            " FROM generate_series(1, 1000000) i"
        )
        conn.execute("CREATE TABLE paw_slow_test.small (id int PRIMARY KEY, kind text)")
        conn.execute("INSERT INTO paw_slow_test.small VALUES (1, 'c'), (2, 'd')")
        conn.execute("ANALYZE paw_slow_test.big")
        conn.execute("ANALYZE paw_slow_test.small")
    yield
    with pg_datasource_connect() as conn:
        conn.execute("DROP SCHEMA IF EXISTS paw_slow_test CASCADE")


@pytest.mark.slow
@pytest.mark.django_db
def test_a_postgresql_value_statement_past_its_time_ends_in_its_savepoint(pg_slow, monkeypatch):
    # 20 ms: a distinct scan of a million rows takes longer, one of two rows far less.
    monkeypatch.setattr(introspection, "VALUE_TIMEOUT", 0.02)
    source = datasource_made(
        slug="slow", name="Slow", dialect="postgresql", connection=pg_datasource_settings(),
        sample_values=True,
    )  # fmt: skip
    assert datasource_schema_refresh(datasource_id=source.pk, user=None)
    texts = schema_texts(source)
    assert column_line(texts["paw_slow_test.big"], "kind") == "- kind text"
    # The transaction went on after the timeout: the small table, tried again alone.
    assert column_line(texts["paw_slow_test.small"], "kind").endswith("'c', 'd'")


def test_a_harvest_over_max_tables_keeps_the_first_and_says_how_many_there_were(
    tmp_path, monkeypatch
):
    path = tmp_path / "three.sqlite3"
    with sqlite3.connect(path) as db:
        for name in ("a", "b", "c"):
            db.execute(f"CREATE TABLE {name} (id INTEGER PRIMARY KEY)")
    monkeypatch.setattr(introspection, "MAX_TABLES", 2)
    said: list[str] = []
    tables = introspection.schema_harvest(
        dialect="sqlite", connection={"database": str(path)}, timeout=30, progress=said.append
    )
    assert [t.name for t in tables] == ["a", "b"]
    assert said == ["2 of 2 tables read (the first 2 of 3)"]


def test_columns_over_max_columns_are_counted_not_kept(tmp_path, monkeypatch):
    path = tmp_path / "wide.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE wide (a TEXT, b TEXT, c TEXT)")
    monkeypatch.setattr(introspection, "MAX_COLUMNS", 2)
    [wide] = introspection.schema_harvest(
        dialect="sqlite", connection={"database": str(path)}, timeout=30
    )
    assert [c.name for c in wide.columns] == ["a", "b"] and wide.more_columns == 1
    assert wide.entry_text() == (
        "Table wide (3 columns, about 0 rows).\nColumns:\n- a TEXT\n- b TEXT\n"
        "- … and 1 more columns"
    )
