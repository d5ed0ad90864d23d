"""The check before ``run_sql`` runs a statement (issue 28, part 4), through the real
paw-agent on real databases (SQLite, PostgreSQL, MariaDB), the scripted model writing SQL:
a statement that does not parse, or that the database will not plan (its ``EXPLAIN``
fails: an unknown column or table), goes back to the model with the database's message and
the schema entries of the tables it names (from the run's knowledge index, written by PAW
from PAW's own harvest), and is not run; the model's next try runs. After
``--sql-retries`` statements sent back, statements run unchecked.

What reached PostgreSQL and MariaDB is read on the wire: the runtime reaches them through
a proxy that keeps every byte the client sent, so "not run" means the statement's text
never went to the server except behind its ``EXPLAIN``."""

from __future__ import annotations

import contextlib
import socket
import sqlite3
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from paw_agent.knowledge import format_entry
from secrets_vault.introspection import schema_harvest
from secrets_vault.models import Datasource, KnowledgeEntry
from secrets_vault.services.knowledge import IndexSource, knowledge_index_write
from tests.live import wait_for
from tests.mariadb import DATABASE as MARIADB_DATABASE
from tests.mariadb import mariadb_cursor, mariadb_settings
from tests.paw_agent.driver import notifies
from tests.paw_agent.test_sql import datasource_env, script, sql_call, tool_results
from tests.pgdatasource import pg_datasource_connect, pg_datasource_settings

pytestmark = pytest.mark.django_db

TABLE = "check_products"
WRONG = "SELECT p.name, p.price FROM check_products p ORDER BY p.id"
RIGHT = "SELECT p.name, p.cost FROM check_products p ORDER BY p.id"
ROWS = "| name | cost |\n|---|---|\n| pen | 1.5 |\n| ink | 4.25 |\n| pad | 3.75 |\n\n(3 rows)"
SENT_BACK = "error: not run; the check before running refused it: "
FOLDER = ".paw/host/knowledge"
#: How each dialect's EXPLAIN starts, as paw-agent sends it.
EXPLAIN = {
    "sqlite": "EXPLAIN QUERY PLAN ",
    "postgresql": "EXPLAIN (ANALYZE FALSE) ",
    "mysql": "EXPLAIN ",
}


class RecordingProxy:
    """A TCP proxy on 127.0.0.1 in front of ``port`` that keeps every byte each client
    connection sent (``streams``): what the database was asked, read on the wire."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.streams: list[bytearray] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            sent = bytearray()
            with self._lock:
                self.streams.append(sent)
            threading.Thread(target=self._pipe, args=(client, upstream, sent), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, None), daemon=True).start()

    def _pipe(self, source: socket.socket, sink: socket.socket, kept: bytearray | None) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                if kept is not None:
                    with self._lock:
                        kept += data
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def sent(self, statement: str, explain: str) -> tuple[int, int]:
        """``(explained, run)``: how many times ``statement`` went to the server behind
        ``explain`` (its check), and on its own (it ran)."""
        needle, prefix = statement.encode(), explain.encode()
        explained = run = 0
        with self._lock:
            streams = [bytes(stream) for stream in self.streams]
        for stream in streams:
            at = stream.find(needle)
            while at >= 0:
                if stream[max(0, at - len(prefix)) : at] == prefix:
                    explained += 1
                else:
                    run += 1
                at = stream.find(needle, at + 1)
        return explained, run

    def close(self) -> None:
        self.listener.close()


@dataclass
class Shop:
    """A datasource ``shop`` holding :data:`TABLE` (three products), as the runtime reaches
    it (``env``), with the run's knowledge (``knowledge``: PAW's index file of its
    harvested schema) and the proxy its statements go through (None for SQLite)."""

    dialect: str
    env: dict[str, str]
    knowledge: dict[str, Any]
    entry: dict[str, Any]
    proxy: RecordingProxy | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def sent(self, statement: str) -> tuple[int, int]:
        """What went to the server of ``statement`` (:meth:`RecordingProxy.sent`)."""
        assert self.proxy is not None
        return self.proxy.sent(statement, EXPLAIN[self.dialect])


PRODUCTS = [(1, "pen", 1.5), (2, "ink", 4.25), (3, "pad", 3.75)]


def _harvested(workspace: Path, dialect: str, connection: dict[str, Any]) -> tuple[dict, dict]:
    """The run's knowledge, as PAW gives it: the datasource's schema harvested by PAW
    (``schema_harvest``), stored as its entries, written as its index file into the
    workspace. Returns the submit's ``knowledge`` and :data:`TABLE`'s entry."""
    datasource = Datasource.objects.create(slug="shop", name="The shop", dialect=dialect)
    tables = schema_harvest(dialect=dialect, connection=connection, timeout=10)
    KnowledgeEntry.objects.bulk_create(
        KnowledgeEntry(
            datasource=datasource, kind="schema", title=t.entry_title(), text=t.entry_text()
        )
        for t in tables
    )
    datasource.refresh_from_db()
    source = IndexSource(
        datasource_id=datasource.pk, slug="shop", version=datasource.knowledge_version
    )
    folder = workspace / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    knowledge_index_write(source=source, path=folder / source.file_name, vector_model="")
    entry = KnowledgeEntry.objects.get(datasource=datasource, title=TABLE)
    shown = {"datasource": "shop", "kind": "schema", "title": entry.title, "text": entry.text}
    knowledge = {
        "entries": [],
        "indexes": [{"datasource": "shop", "path": f"{FOLDER}/{source.file_name}"}],
    }
    return knowledge, shown


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def shop(request, tmp_path: Path, workspace: Path) -> Iterator[Shop]:
    """:class:`Shop` on each database."""
    kind = request.param
    if kind == "sqlite":
        path = tmp_path / "shop.sqlite3"
        with sqlite3.connect(path) as db:
            db.execute(
                f"CREATE TABLE {TABLE} (id INTEGER PRIMARY KEY, name TEXT NOT NULL, cost REAL)"
            )
            db.executemany("INSERT INTO check_products VALUES (?, ?, ?)", PRODUCTS)
        knowledge, entry = _harvested(workspace, "sqlite", {"database": str(path)})
        yield Shop(
            "sqlite", datasource_env("shop", "sqlite", f"sqlite:///{path}"), knowledge, entry
        )
        return
    if kind == "postgresql":
        with pg_datasource_connect() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
            conn.execute(
                f"CREATE TABLE {TABLE} (id int PRIMARY KEY, name text NOT NULL, cost numeric)"
            )
            conn.cursor().executemany("INSERT INTO check_products VALUES (%s, %s, %s)", PRODUCTS)
        settings = pg_datasource_settings(reader=False)
        knowledge, entry = _harvested(workspace, "postgresql", settings)
        proxy = RecordingProxy(settings["port"])
        url = f"postgres://{settings['user']}@127.0.0.1:{proxy.port}/{settings['database']}?sslmode=disable"
        try:
            yield Shop(
                "postgresql", datasource_env("shop", "postgresql", url), knowledge, entry, proxy
            )
        finally:
            proxy.close()
            with pg_datasource_connect() as conn:
                conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        return
    with mariadb_cursor() as cursor:
        cursor.execute(f"DROP TABLE IF EXISTS {TABLE}")
        cursor.execute(
            f"CREATE TABLE {TABLE} (id INT PRIMARY KEY, name VARCHAR(20) NOT NULL, cost DECIMAL(6,2))"
        )
        cursor.executemany("INSERT INTO check_products VALUES (%s, %s, %s)", PRODUCTS)
    settings = mariadb_settings(reader=False)
    knowledge, entry = _harvested(workspace, "mysql", mariadb_settings())
    proxy = RecordingProxy(settings["port"])
    url = f"mysql://{settings['user']}@127.0.0.1:{proxy.port}/{MARIADB_DATABASE}"
    try:
        yield Shop("mysql", datasource_env("shop", "mysql", url), knowledge, entry, proxy)
    finally:
        proxy.close()
        with mariadb_cursor() as cursor:
            cursor.execute(f"DROP TABLE IF EXISTS {TABLE}")


#: The database's message for :data:`WRONG`, as the model gets it.
UNKNOWN_COLUMN = {
    "sqlite": "SQLite error: no such column: p.price",
    # PostgreSQL quotes the line: the model sees its own statement there, not the EXPLAIN.
    "postgresql": f"PostgreSQL error: column p.price does not exist\nLINE 1: {WRONG}\n"
    + " " * len("LINE 1: SELECT p.name, ")
    + "^",
    "mysql": "MySQL error: Unknown column 'p.price' in '",
}
ROWS_SHOWN = {
    "sqlite": ROWS,
    "postgresql": ROWS,
    "mysql": ROWS.replace("| 1.5 |", "| 1.50 |"),
}


def tail(left: int) -> str:
    if left:
        return (
            f"Correct the statement and call run_sql again ({left} more may be sent back in "
            "this run; then statements run unchecked)."
        )
    return "Correct the statement and call run_sql again (the next statements of this run run unchecked)."


def test_a_wrong_column_is_sent_back_with_the_tables_schema_and_the_fix_runs(start, model, shop):
    model.load(script(sql_call(WRONG), sql_call(RIGHT)))
    runtime = start("paw-agent", env=shop.env)
    runtime.ready()
    lines = runtime.submit("What do the products cost?", knowledge=shop.knowledge)
    checked, ran = tool_results(model)
    table = format_entry(shop.entry)
    assert checked.startswith(SENT_BACK + UNKNOWN_COLUMN[shop.dialect]), checked
    assert checked.endswith(
        "\n\nThe tables it names, as PAW knows them:\n\n" + table + "\n\n" + tail(1)
    ), checked
    assert "- cost " in table  # the harvested entry names the right column
    assert ran == ROWS_SHOWN[shop.dialect]
    first, second = notifies(lines, "tool")
    assert (first["ok"], first["summary"]) == (False, "checked: unknown column p.price")
    assert {k: first["sql_check"][k] for k in ("ok", "outcome", "code", "name", "message")} == {
        "ok": False,
        "outcome": "refused",
        "code": "unknown_column",
        "name": "p.price",
        "message": "unknown column p.price",
    }
    assert (first["sql_check"]["explained"], first["sql_check"]["left"]) == (True, 1)
    assert (first["sql_run"]["error"], first["sql_run"]["explained"]) == ("check_failed", True)
    assert "sql_result" not in first
    assert second["ok"] is True and second["sql_check"]["ok"] is True
    assert (second["sql_run"]["error"], second["sql_run"]["explained"]) == (None, True)
    assert second["sql_result"]["rows"][0][0] == "pen"
    if shop.proxy is not None:  # on the wire: the wrong one only as its EXPLAIN
        assert shop.sent(WRONG) == (1, 0)
        assert shop.sent(RIGHT) == (1, 1)


def test_a_statement_that_does_not_parse_is_sent_back_unsent(start, model, shop):
    broken = "SELECT name FORM check_products"
    model.load(script(sql_call(broken), sql_call(RIGHT)))
    runtime = start("paw-agent", env=shop.env)
    runtime.ready()
    lines = runtime.submit("What do the products cost?", knowledge=shop.knowledge)
    checked, ran = tool_results(model)
    assert checked == (
        SENT_BACK
        + "the statement does not parse: Invalid expression / Unexpected token (line 1, column 31)"
        + f"\n{broken}\n{' ' * 30}^"
        + "\n\nThe tables it names, as PAW knows them:\n\n"
        + format_entry(shop.entry)
        + "\n\n"
        + tail(1)
    )
    assert ran == ROWS_SHOWN[shop.dialect]
    first = notifies(lines, "tool")[0]
    assert first["summary"] == f"checked: does not parse near {TABLE}"
    assert (first["sql_check"]["code"], first["sql_check"]["explained"]) == ("unparsed", False)
    assert "sql_run" not in first  # nothing went to the database
    assert notifies(lines, "ask") == []  # not a read, yet nobody was asked: it was sent back
    if shop.proxy is not None:
        assert shop.sent(broken) == (0, 0)


def test_an_unknown_table_brings_the_tables_named_like_it(start, model, shop):
    wrong = "SELECT name, cost FROM check_product ORDER BY id"
    model.load(script(sql_call(wrong)))
    runtime = start("paw-agent", env=shop.env)
    runtime.ready()
    lines = runtime.submit("What do the products cost?", knowledge=shop.knowledge)
    [checked] = tool_results(model)
    message = {
        "sqlite": "SQLite error: no such table: check_product",
        "postgresql": 'PostgreSQL error: relation "check_product" does not exist',
        "mysql": f"MySQL error: Table '{MARIADB_DATABASE}.check_product' doesn't exist",
    }[shop.dialect]
    assert checked.startswith(SENT_BACK + message), checked
    assert checked.endswith(
        "\n\nPAW knows no table named check_product; the tables named most like it:\n\n"
        + format_entry(shop.entry)
        + "\n\n"
        + tail(1)
    ), checked
    first = notifies(lines, "tool")[0]
    assert first["summary"] == "checked: unknown table check_product"
    assert (first["sql_check"]["code"], first["sql_check"]["name"]) == (
        "unknown_table",
        "check_product",
    )
    if shop.proxy is not None:
        assert shop.sent(wrong) == (1, 0)


def test_after_the_retries_a_statement_runs_unchecked_and_its_real_error_returns(
    start, model, shop
):
    again = WRONG.replace("ORDER BY p.id", "ORDER BY p.name")
    last = WRONG.replace("ORDER BY p.id", "ORDER BY p.cost")
    model.load(script(sql_call(WRONG), sql_call(again), sql_call(last)))
    runtime = start("paw-agent", env=shop.env)
    runtime.ready()
    lines = runtime.submit("What do the products cost?", knowledge=shop.knowledge)
    first, second, third = tool_results(model)
    assert first.startswith(SENT_BACK) and first.endswith(tail(1))
    assert second.startswith(SENT_BACK) and second.endswith(tail(0))
    # The third is run as it is, and fails on the database as it would without the check.
    start_of = {
        "sqlite": "error: SQLite error: no such column: p.price",
        "postgresql": "error: PostgreSQL error: column p.price does not exist",
        "mysql": "error: MySQL error: Unknown column 'p.price'",
    }[shop.dialect]
    assert third.startswith(start_of), third
    assert "PAW knows" not in third
    rows = notifies(lines, "tool")
    assert [r["summary"].startswith("checked: ") for r in rows] == [True, True, False]
    skipped = rows[2]["sql_check"]
    assert (skipped["ok"], skipped["outcome"], skipped["code"]) == (None, "skipped", "retries_used")
    assert skipped["message"] == "not checked: 2 statements were sent back already"
    assert (rows[2]["sql_run"]["error"], rows[2]["sql_run"]["explained"]) == (
        "database_error",
        False,
    )
    if shop.proxy is not None:
        assert [shop.sent(s) for s in (WRONG, again, last)] == [(1, 0), (1, 0), (0, 1)]


def test_retries_zero_turns_the_check_off(start, model, shop):
    model.load(script(sql_call(WRONG), sql_call(RIGHT)))
    runtime = start("paw-agent", "--sql-retries", "0", env=shop.env)
    runtime.ready()
    lines = runtime.submit("What do the products cost?", knowledge=shop.knowledge)
    failed, ran = tool_results(model)
    assert failed.startswith("error: " + UNKNOWN_COLUMN[shop.dialect].split("\n")[0])
    assert ran == ROWS_SHOWN[shop.dialect]
    assert all("sql_check" not in row for row in notifies(lines, "tool"))
    if shop.proxy is not None:
        assert [shop.sent(s) for s in (WRONG, RIGHT)] == [(0, 1), (0, 1)]


# --- The EXPLAIN under the run's limits (PostgreSQL: a lock makes it wait) ----------------------


@pytest.fixture
def locked_products() -> Iterator[tuple[dict[str, str], Any]]:
    """:data:`TABLE` on the PostgreSQL datasource database, with a connection holding an
    ``ACCESS EXCLUSIVE`` lock on it (an open transaction): every statement that names it,
    its EXPLAIN too, waits. Yields the datasource's env and that connection (roll it back
    to let them through)."""
    with pg_datasource_connect() as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(f"CREATE TABLE {TABLE} (id int PRIMARY KEY, name text NOT NULL, cost numeric)")
        conn.cursor().executemany("INSERT INTO check_products VALUES (%s, %s, %s)", PRODUCTS)
    settings = pg_datasource_settings(reader=False)
    url = f"postgres://{settings['user']}@{settings['host']}:{settings['port']}/{settings['database']}"
    locker = psycopg.connect(url)
    locker.execute(f"LOCK TABLE {TABLE} IN ACCESS EXCLUSIVE MODE")
    try:
        yield datasource_env("shop", "postgresql", url), locker
    finally:
        locker.rollback()
        locker.close()
        with pg_datasource_connect() as conn:
            conn.execute(f"DROP TABLE IF EXISTS {TABLE}")


def waiting(prefix: str) -> list[tuple[int, str]]:
    """paw-agent's statements on the datasource database that start with ``prefix``,
    still going: ``(pid, query)``."""
    with pg_datasource_connect() as conn:
        return conn.execute(
            "SELECT pid, query FROM pg_stat_activity WHERE application_name = 'paw-agent' "
            "AND state = 'active' AND query LIKE %s",
            [prefix + "%"],
        ).fetchall()


def test_an_explain_slower_than_its_limit_lets_the_statement_run(start, model, locked_products):
    env, locker = locked_products
    model.load(script(sql_call(RIGHT)))
    runtime = start("paw-agent", "--sql-check-timeout", "1", env=env)
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "costs", "run_id": "r1"})
    # The EXPLAIN waits for the lock and gives up after its second; then the statement
    # itself (read through a cursor) waits: let it through.
    wait_for(lambda: waiting("DECLARE"), what="the statement itself waiting for the lock")
    locker.rollback()
    lines = runtime.run_lines("r1")
    [row] = notifies(lines, "tool")
    assert row["ok"] is True
    assert {k: row["sql_check"][k] for k in ("ok", "outcome", "code", "explained")} == {
        "ok": None,
        "outcome": "timeout",
        "code": "timeout",
        "explained": True,
    }
    assert row["sql_check"]["message"] == "not checked: planning took longer than 1 s"
    assert row["sql_run"]["explained"] is True
    assert tool_results(model) == [ROWS]


def test_a_cancel_stops_the_explain_on_the_server(start, model, locked_products):
    env, _ = locked_products
    model.load(script(sql_call(RIGHT)))
    runtime = start("paw-agent", "--sql-check-timeout", "60", env=env)
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "costs", "run_id": "r1"})
    wait_for(lambda: waiting(EXPLAIN["postgresql"]), what="the EXPLAIN waiting for the lock")
    runtime.send({"op": "cancel", "run_id": "r1"})
    result = runtime.wait_for(lambda x: x.get("type") == "result", timeout=10)
    assert result["cancelled"] is True
    wait_for(lambda: not waiting(EXPLAIN["postgresql"]), what="the EXPLAIN cancelled on the server")
    assert waiting("DECLARE") == []  # and the statement never started
