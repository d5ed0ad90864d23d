"""Examples re-checked on every schema refresh, on a real schema change in PostgreSQL and
MariaDB: a broken example becomes stale with the database's error and is kept from runs
(their entries and the sandbox's index file), fixing it or restoring the column brings it
back, and the refresh records what changed (tables and columns added, removed, retyped).
Then the admin's and the API's view of it, the worker's path, and the re-check's bound."""

from __future__ import annotations

import contextlib
import sqlite3
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from paw_project.errors import InvalidRequest
from secrets_vault.models import Datasource, KnowledgeEntry
from secrets_vault.selectors import datasource_stale_examples
from secrets_vault.services import knowledge
from secrets_vault.services.knowledge import (
    IndexSource,
    datasource_schema_refresh,
    knowledge_entry_create,
    knowledge_entry_update,
    knowledge_for_run,
    knowledge_index_write,
)
from tests.factories import datasource_made
from tests.live import wait_for
from tests.mariadb import mariadb_cursor, mariadb_settings
from tests.pgdatasource import _server, pg_datasource_settings

TABLES = ("st_items", "st_legacy", "st_orders", "st_refunds")


@dataclass
class Backend:
    """A real database the test changes: its datasource ``connection``, ``run(sql)`` (as
    its owner, autocommit), how it spells the types the test uses, and the words of its
    error for an unknown column."""

    dialect: str
    connection: dict[str, Any]
    run: Callable[[str], None]
    text_type: str
    short_text_type: str
    money_type: str
    unknown_column: str


@contextlib.contextmanager
def _postgresql() -> Iterator[Backend]:
    """A database of its own on the test server (``<test db>_stale``), made afresh and
    dropped afterwards; the datasource reads it as the read-only test user."""
    import psycopg

    server = _server()
    name = f"{server['name']}_stale"
    admin = {"host": server["host"], "port": server["port"], "user": server["user"]}
    with psycopg.connect(**admin, dbname="postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    owner = psycopg.connect(**admin, dbname=name, autocommit=True)
    try:
        yield Backend(
            dialect="postgresql",
            connection={**pg_datasource_settings(), "database": name},
            run=lambda sql: owner.execute(sql),
            text_type="text",
            short_text_type="character varying(3)",
            money_type="numeric(8,2)",
            unknown_column='column "total" does not exist',
        )
    finally:
        owner.close()
        with psycopg.connect(**admin, dbname="postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def _mariadb() -> Iterator[Backend]:
    """The tests' MariaDB database, with this test's ``st_*`` tables dropped before and
    after; the datasource reads it as the SELECT-only test user."""
    connection = mariadb_settings()

    def run(sql: str) -> None:
        with mariadb_cursor() as cursor:
            cursor.execute(sql)

    def drop() -> None:
        for table in TABLES:
            run(f"DROP TABLE IF EXISTS {table}")

    drop()
    try:
        yield Backend(
            dialect="mysql",
            connection=connection,
            run=run,
            text_type="text",
            short_text_type="varchar(3)",
            money_type="decimal(8,2)",
            unknown_column="Unknown column 'total'",
        )
    finally:
        drop()


@pytest.fixture(params=["postgresql", "mariadb"])
def backend(request) -> Iterator[Backend]:
    with {"postgresql": _postgresql, "mariadb": _mariadb}[request.param]() as made:
        yield made


def _example(datasource: Datasource, title: str, sql: str) -> KnowledgeEntry:
    return knowledge_entry_create(
        datasource=datasource, kind="example", title=title, sql=sql, user=None
    )


def _given_to_runs(datasource: Datasource, prompt: str) -> set[str]:
    """The titles of the examples a run of a signed-in person on ``datasource`` is given
    for ``prompt``."""
    from django.contrib.auth import get_user_model

    person, _ = get_user_model().objects.get_or_create(username="alice")
    found = knowledge_for_run(datasource_slugs=[datasource.slug], prompt=prompt, user=person)
    return {e["title"] for e in found.entries if e["kind"] == "example"}


def _in_index_file(datasource: Datasource, tmp_path) -> set[str]:
    """The titles of the examples in the sandbox's index file of ``datasource``."""
    datasource.refresh_from_db()
    source = IndexSource(
        datasource_id=datasource.pk, slug=datasource.slug, version=datasource.knowledge_version
    )
    path = tmp_path / source.file_name
    knowledge_index_write(source=source, path=path, vector_model="")
    with contextlib.closing(sqlite3.connect(path)) as db:
        return {title for (title,) in db.execute("SELECT title FROM entries WHERE kind='example'")}


def _no_change() -> dict[str, Any]:
    return {
        "first_harvest": False,
        "tables_added": [],
        "tables_removed": [],
        "columns_added": {},
        "columns_removed": {},
        "columns_retyped": {},
    }


def _changes(datasource: Datasource) -> dict[str, Any]:
    """The last refresh's diff, without its time and the examples' summary."""
    datasource.refresh_from_db()
    return {k: v for k, v in datasource.schema_changes.items() if k not in ("at", "examples")}


@pytest.mark.django_db
def test_a_real_schema_change_makes_an_example_stale_until_fixed_or_the_column_is_back(
    backend, tmp_path
):
    run = backend.run
    run("CREATE TABLE st_orders (id int PRIMARY KEY, day text, total numeric(8,2), note text)")
    run("CREATE TABLE st_items (id int PRIMARY KEY, order_id int)")
    run("CREATE TABLE st_legacy (id int PRIMARY KEY)")
    run("INSERT INTO st_orders VALUES (1, 'Sat', 20.50, 'a'), (2, 'Sun', 31.00, 'b')")
    source = datasource_made(
        slug="stale", name="Stale", dialect=backend.dialect, connection=backend.connection
    )
    per_day = _example(
        source, "Total per day", "SELECT day, sum(total) FROM st_orders GROUP BY day"
    )
    big = _example(source, "Big orders total", "SELECT id, total FROM st_orders WHERE total > 25")
    items = _example(source, "How many order items", "SELECT count(*) FROM st_items")

    assert datasource_schema_refresh(datasource_id=source.pk, user=None)
    source.refresh_from_db()
    first = source.schema_changes
    assert first["first_harvest"] is True and first["at"]
    assert {"st_items", "st_legacy", "st_orders"} <= set(first["tables_added"])
    assert first["examples"] == {"checked": 3, "stale": 0, "unstaled": 0, "pending": 0}
    assert source.schema_tables["st_orders"] == {
        "id": "integer" if backend.dialect == "postgresql" else "int(11)",
        "day": backend.text_type,
        "total": backend.money_type,
        "note": backend.text_type,
    }
    assert not KnowledgeEntry.objects.filter(stale_since__isnull=False).exists()
    assert {"Total per day", "Big orders total"} <= _given_to_runs(source, "total orders")
    version = source.knowledge_version

    # The schema moves: a column renamed away, one added, one retyped, a table dropped and
    # one made.
    run("ALTER TABLE st_orders RENAME COLUMN total TO amount")
    run("ALTER TABLE st_orders ADD COLUMN currency text")
    if backend.dialect == "postgresql":
        run("ALTER TABLE st_orders ALTER COLUMN day TYPE varchar(3)")
    else:
        run("ALTER TABLE st_orders MODIFY day varchar(3)")
    run("DROP TABLE st_legacy")
    run("CREATE TABLE st_refunds (id int PRIMARY KEY)")
    assert datasource_schema_refresh(datasource_id=source.pk, user=None)

    assert _changes(source) == {
        **_no_change(),
        "tables_added": ["st_refunds"],
        "tables_removed": ["st_legacy"],
        "columns_added": {"st_orders": ["amount", "currency"]},
        "columns_removed": {"st_orders": ["total"]},
        "columns_retyped": {
            "st_orders": [
                {"column": "day", "from": backend.text_type, "to": backend.short_text_type}
            ]
        },
    }
    assert source.schema_changes["examples"] == {
        "checked": 3, "stale": 2, "unstaled": 0, "pending": 0,
    }  # fmt: skip
    assert source.knowledge_version > version
    for broken in (per_day, big):
        broken.refresh_from_db()
        assert broken.stale_since is not None
        assert backend.unknown_column in broken.stale_error, broken.stale_error
    items.refresh_from_db()
    assert items.stale_since is None and items.stale_error == ""
    given = _given_to_runs(source, "total orders items")
    assert "Total per day" not in given and "Big orders total" not in given
    assert "How many order items" in given
    assert _in_index_file(source, tmp_path) == {"How many order items"}
    assert datasource_stale_examples(source) == 2
    big.refresh_from_db()
    stale_since = big.stale_since

    # Nothing changed: the diff says so, and a still failing example stays stale since then.
    assert datasource_schema_refresh(datasource_id=source.pk, user=None)
    assert _changes(source) == _no_change()
    big.refresh_from_db()
    assert big.stale_since == stale_since

    # Fixing the SQL clears it at once.
    fixed = knowledge_entry_update(
        entry=KnowledgeEntry.objects.get(pk=per_day.pk),
        user=None,
        sql="SELECT day, sum(amount) FROM st_orders GROUP BY day",
    )
    assert fixed.stale_since is None and fixed.stale_error == ""
    assert "Total per day" in _given_to_runs(source, "total orders")
    assert "Big orders total" not in _given_to_runs(source, "total orders")

    # The column comes back: the next refresh un-stales the example that reads it.
    run("ALTER TABLE st_orders ADD COLUMN total numeric(8,2)")
    assert datasource_schema_refresh(datasource_id=source.pk, user=None)
    assert _changes(source) == {**_no_change(), "columns_added": {"st_orders": ["total"]}}
    assert source.schema_changes["examples"] == {
        "checked": 3, "stale": 0, "unstaled": 1, "pending": 0,
    }  # fmt: skip
    big.refresh_from_db()
    assert big.stale_since is None and big.stale_error == ""
    assert {"Total per day", "Big orders total"} <= _given_to_runs(source, "total orders")
    assert _in_index_file(source, tmp_path) == {
        "Total per day", "Big orders total", "How many order items",
    }  # fmt: skip


@pytest.fixture
def shop_file(tmp_path):
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, day TEXT, total REAL)")
        db.execute("INSERT INTO orders (day, total) VALUES ('Sat', 20.5), ('Sun', 31.0)")
    return path


def _break(path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("ALTER TABLE orders RENAME COLUMN total TO amount")


@pytest.mark.django_db
def test_saving_a_stale_example_runs_its_sql_again_and_a_failing_save_is_refused(shop_file):
    source = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )
    example = _example(source, "Total", "SELECT sum(total) FROM orders")
    datasource_schema_refresh(datasource_id=source.pk, user=None)
    _break(shop_file)
    datasource_schema_refresh(datasource_id=source.pk, user=None)
    example.refresh_from_db()
    assert "no such column: total" in example.stale_error
    # Saving it unchanged runs it again: it still fails, so it is refused and stays stale.
    with pytest.raises(InvalidRequest) as refused:
        knowledge_entry_update(entry=example, user=None, title="Total of all orders")
    assert refused.value.code == "example_failed"
    example.refresh_from_db()
    assert example.title == "Total" and example.stale_since is not None
    # The column is back: saving it unchanged passes and clears it, before any refresh.
    with sqlite3.connect(shop_file) as db:
        db.execute("ALTER TABLE orders RENAME COLUMN amount TO total")
    saved = knowledge_entry_update(entry=example, user=None, title="Total of all orders")
    assert saved.stale_since is None and saved.stale_error == "" and saved.checked_at


@pytest.mark.django_db
def test_the_recheck_stops_at_its_budget_and_the_least_recently_checked_go_first(
    shop_file, monkeypatch
):
    source = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )
    first = _example(source, "First", "SELECT sum(total) FROM orders")
    second = _example(source, "Second", "SELECT total FROM orders")
    datasource_schema_refresh(datasource_id=source.pk, user=None)
    _break(shop_file)
    # A clock at which the budget is spent after one example.
    ticks = iter([0.0, 0.0, 1000.0, 1000.0])
    monkeypatch.setattr(
        knowledge, "time", types.SimpleNamespace(monotonic=lambda: next(ticks, 1000.0))
    )
    datasource_schema_refresh(datasource_id=source.pk, user=None)
    source.refresh_from_db()
    assert source.schema_changes["examples"] == {
        "checked": 1, "stale": 1, "unstaled": 0, "pending": 1,
    }  # fmt: skip
    # Both were last checked by the first refresh, the first one earlier: it went first.
    first.refresh_from_db()
    second.refresh_from_db()
    assert first.stale_since is not None and second.stale_since is None
    # The next refresh takes the one left first.
    ticks = iter([0.0, 0.0, 1000.0, 1000.0])
    datasource_schema_refresh(datasource_id=source.pk, user=None)
    second.refresh_from_db()
    assert second.stale_since is not None


@pytest.mark.django_db
def test_the_admin_and_the_api_show_stale_examples_and_what_changed(operator_client, shop_file):
    source = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )
    example = _example(source, "Total per day", "SELECT day, sum(total) FROM orders GROUP BY day")
    fine = _example(source, "Days", "SELECT DISTINCT day FROM orders")
    datasource_schema_refresh(datasource_id=source.pk, user=None)
    _break(shop_file)
    datasource_schema_refresh(datasource_id=source.pk, user=None)

    shown = operator_client.get("/api/admin/datasources/shop").json()
    assert shown["stale_examples"] == 1
    assert shown["schema_changes"]["columns_added"] == {"orders": ["amount"]}
    assert shown["schema_changes"]["columns_removed"] == {"orders": ["total"]}
    assert shown["schema_changes"]["examples"]["stale"] == 1
    listed = operator_client.get("/api/admin/datasources").json()["datasources"]
    assert [d["stale_examples"] for d in listed] == [1]
    entry = operator_client.get(f"/api/admin/datasources/shop/knowledge/{example.pk}").json()
    assert "no such column: total" in entry["stale_error"] and entry["stale_since"]
    assert (
        operator_client.get(f"/api/admin/datasources/shop/knowledge/{fine.pk}").json()[
            "stale_since"
        ]
        is None
    )
    # What users see of the datasource is what runs are given: not the stale example.
    user_view = operator_client.get("/api/datasources/shop").json()
    assert [e["title"] for e in user_view["examples"]] == ["Days"]

    entries = "/admin/secrets_vault/knowledgeentry/"
    stale_only = operator_client.get(entries, {"stale": "yes"}).content.decode()
    assert "Total per day" in stale_only and "Days" not in stale_only
    not_stale = operator_client.get(entries, {"stale": "no"}).content.decode()
    assert "Days" in not_stale and "Total per day" not in not_stale
    page = operator_client.get(f"{entries}{example.pk}/change/").content.decode()
    assert "paw-stale" in page and "no such column: total" in page
    datasources = operator_client.get("/admin/secrets_vault/datasource/").content.decode()
    assert 'class="field-stale_examples">1<' in datasources
    change = operator_client.get(f"/admin/secrets_vault/datasource/{source.pk}/change/")
    html = change.content.decode()
    assert "+ column orders.amount" in html and "- column orders.total" in html
    assert "paw-stale" in html  # the inline shows the error too


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_workers_refresh_rechecks_the_examples(make_client, celery_worker, shop_file):
    from django.contrib.auth import get_user_model

    client = make_client(get_user_model().objects.create_superuser("op", password=None))
    source = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )
    example = _example(source, "Total", "SELECT sum(total) FROM orders")
    _break(shop_file)
    assert client.post("/api/admin/datasources/shop/refresh-schema").status_code == 202
    stale = wait_for(
        lambda: KnowledgeEntry.objects.filter(pk=example.pk, stale_since__isnull=False).first(),
        timeout=60,
        what="the worker's re-check",
    )
    assert "no such column: total" in stale.stale_error
    source.refresh_from_db()
    assert source.schema_changes["first_harvest"] is True
    assert source.schema_tables == {"orders": {"id": "INTEGER", "day": "TEXT", "amount": "REAL"}}


@pytest.mark.django_db
def test_a_stale_examples_error_has_the_secret_values_masked():
    from secrets_vault.services import secret_set
    from tests.secrets_vault.conftest import secret_value

    password = secret_value("stalepw")
    secret_set(name="STALE_PW", value=password)  # trust auth: any password is accepted
    with _postgresql() as backend:
        # A table named like the secret, so that the database's error repeats it.
        backend.run(f'CREATE TABLE "{password}" (id int)')
        source = datasource_made(
            slug="stale", name="Stale", dialect="postgresql",
            connection={**backend.connection, "password": "{secret:STALE_PW}"},
        )  # fmt: skip
        example = _example(source, "Named", f'SELECT id FROM "{password}"')  # noqa: S608 - a test's own name
        backend.run(f'DROP TABLE "{password}"')
        assert datasource_schema_refresh(datasource_id=source.pk, user=None) == 0
        example.refresh_from_db()
        assert example.stale_since is not None and "does not exist" in example.stale_error
        assert password not in example.stale_error, example.stale_error


@pytest.mark.django_db
def test_a_flagged_example_is_not_run_again(shop_file):
    source = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )
    example = _example(source, "Total", "SELECT sum(total) FROM orders")
    KnowledgeEntry.objects.filter(pk=example.pk).update(flag_reason="Not a read (test).")
    _break(shop_file)
    datasource_schema_refresh(datasource_id=source.pk, user=None)
    source.refresh_from_db()
    assert source.schema_changes["examples"]["checked"] == 0
    example.refresh_from_db()
    assert example.stale_since is None and example.checked_at is not None


def test_the_diff_is_computed_from_the_structure_and_shown_line_by_line():
    from secrets_vault.introspection import Column, Table
    from secrets_vault.schema_changes import schema_diff, schema_diff_lines, schema_structure

    before = schema_structure(
        [Table(name="a", columns=[Column("id", "int"), Column("x", "text")]), Table(name="b")]
    )
    assert before == {"a": {"id": "int", "x": "text"}, "b": {}}
    first = schema_diff(None, before)
    assert first["first_harvest"] is True and first["tables_added"] == ["a", "b"]
    assert schema_diff_lines(first) == ["First harvest: 2 tables."]
    after = {"a": {"id": "bigint", "y": "text"}, "c": {"id": "int"}}
    changes = schema_diff(before, after)
    assert schema_diff_lines(changes) == [
        "+ table c", "- table b", "+ column a.y", "- column a.x", "~ column a.id: int → bigint",
    ]  # fmt: skip
    assert schema_diff(after, after) == {**_no_change()}
    assert schema_diff_lines(schema_diff(after, after)) == []
    many = schema_diff({"t": {}}, {"t": {f"c{i}": "int" for i in range(5)}})
    assert schema_diff_lines(many, limit=2) == ["+ column t.c0", "+ column t.c1", "… and 3 more"]
