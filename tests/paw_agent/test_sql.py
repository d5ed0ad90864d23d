"""run_sql on real databases: a SQLite file and the test PostgreSQL server, with writes
behind the approval gate and reads forced read-only."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from tests.live import wait_for
from tests.mariadb import mariadb_cursor, mariadb_database_url
from tests.paw_agent.driver import notifies
from tests.processes import worker_database_url


def script(*responses, fallback="Fine."):
    return {"api_key": "sk-runtime-test", "responses": list(responses), "fallback": fallback}


def sql_call(query: str, datasource: str = "shop") -> dict:
    return {
        "tool_calls": [{"name": "run_sql", "arguments": {"datasource": datasource, "query": query}}]
    }


def datasource_env(slug: str, dialect: str, url: str, *, read_only: bool = False) -> dict[str, str]:
    return {
        "PAW_DATASOURCES": json.dumps(
            [
                {
                    "slug": slug,
                    "name": "The shop",
                    "dialect": dialect,
                    "description": "orders and customers",
                    "env": f"PAW_DATASOURCE_{slug.upper()}_URL",
                    "read_only": read_only,
                }
            ]
        ),
        f"PAW_DATASOURCE_{slug.upper()}_URL": url,
    }


def tool_results(model) -> list[str]:
    return [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"]


@pytest.fixture
def shop_sqlite(tmp_path: Path) -> Path:
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, day TEXT, total REAL)")
        connection.executemany(
            "INSERT INTO orders (day, total) VALUES (?, ?)",
            [("Sat", 20.5), ("Sun", 31.0), ("Sun", 12.25)],
        )
    return path


def count_sqlite(path: Path) -> int:
    with sqlite3.connect(path) as connection:
        return connection.execute("SELECT count(*) FROM orders").fetchone()[0]


def test_sqlite_select_returns_a_table_and_the_model_knows_the_datasource(
    start, model, shop_sqlite
):
    model.load(
        script(sql_call("SELECT day, sum(total) AS total FROM orders GROUP BY day ORDER BY day"))
    )
    runtime = start("paw-agent", env=datasource_env("shop", "sqlite", f"sqlite:///{shop_sqlite}"))
    runtime.ready()
    lines = runtime.submit("totals by day")
    assert tool_results(model) == [
        "| day | total |\n|---|---|\n| Sat | 20.5 |\n| Sun | 43.25 |\n\n(2 rows)"
    ]
    assert notifies(lines, "ask") == []  # a read needs no approval
    system = model.requests[0]["messages"][0]["content"]
    assert "- shop: The shop (sqlite) — orders and customers" in system
    assert "run_sql" in [t["function"]["name"] for t in model.requests[0]["tools"]]


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "declined"])
def test_sqlite_write_needs_approval(start, model, shop_sqlite, approve):
    model.load(script(sql_call("DELETE FROM orders WHERE day = 'Sun'")))
    runtime = start("paw-agent", env=datasource_env("shop", "sqlite", f"sqlite:///{shop_sqlite}"))
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "drop sunday", "run_id": "r1"})
    ask = runtime.wait_for(lambda x: x.get("kind") == "ask")["data"]
    assert ask["kind"] == "confirm"
    assert ask["prompt"] == (
        "run_sql on The shop (shop, sqlite) — this statement is not a read, so it may change "
        "data: it is a DELETE statement; a read is one SELECT, WITH or EXPLAIN.\n"
        "DELETE FROM orders WHERE day = 'Sun'"
    )
    runtime.send(
        {
            "op": "answer",
            "run_id": "r1",
            "answers": ["yes" if approve else "no"],
            "ask_id": ask["ask_id"],
        }
    )
    runtime.run_lines("r1")
    if approve:
        assert tool_results(model) == ["statement executed; 2 rows changed"]
        assert count_sqlite(shop_sqlite) == 1
    else:
        assert tool_results(model) == ["declined by the user"]
        assert count_sqlite(shop_sqlite) == 3


def approve_every_confirm(runtime, run_id: str) -> list[dict]:
    """Run ``run_id`` to its result, approving each confirm it asks; its lines."""
    lines = []
    while True:
        line = runtime.wait_for(lambda x: x.get("kind") == "ask" or x.get("type") == "result")
        lines.append(line)
        if line.get("type") == "result":
            return lines
        runtime.send(
            {"op": "answer", "run_id": run_id, "answers": ["yes"], "ask_id": line["data"]["ask_id"]}
        )


def test_a_sqlite_url_as_paw_writes_it_percent_encoded_and_read_only(start, model, tmp_path):
    """PAW hands over ``sqlite:////abs/path?mode=ro`` with the path percent-encoded
    (secrets_vault.connections): the file is found, and even an approved write is refused."""
    path = tmp_path / "shop file é.sqlite3"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
        connection.execute("INSERT INTO orders (total) VALUES (9.5)")
    url = f"sqlite:///{quote(str(path), safe='/')}?mode=ro"
    model.load(script(sql_call("SELECT total FROM orders"), sql_call("DELETE FROM orders")))
    runtime = start("paw-agent", env=datasource_env("shop", "sqlite", url))
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "read, then delete", "run_id": "r1"})
    approve_every_confirm(runtime, "r1")
    read, write = tool_results(model)
    assert read == "| total |\n|---|\n| 9.5 |\n\n(1 row)"
    assert write.startswith("error: SQLite error:") and "readonly" in write
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT count(*) FROM orders").fetchone()[0] == 1


def test_a_read_only_datasource_refuses_writes_without_asking(start, model, shop_sqlite):
    model.load(script(sql_call("DELETE FROM orders")))
    env = datasource_env("shop", "sqlite", f"sqlite:///{shop_sqlite}", read_only=True)
    runtime = start("paw-agent", env=env)
    runtime.ready()
    lines = runtime.submit("delete everything")
    assert notifies(lines, "ask") == []  # nothing to approve: it cannot happen
    assert tool_results(model) == [
        "error: datasource shop is read-only and this statement is not a read: it is a DELETE "
        "statement; a read is one SELECT, WITH or EXPLAIN. Only one SELECT, WITH or EXPLAIN "
        "that changes nothing and calls only the usual functions runs on it"
    ]
    assert count_sqlite(shop_sqlite) == 3


def test_sql_errors_go_back_to_the_model_and_code_never_sees_credentials(start, model, shop_sqlite):
    code = (
        "import os\nprint(sorted(k for k, v in os.environ.items() if k.startswith("
        "('OPENAI', 'PAW_DATASOURCE')) or v == 'sk-runtime-test'), os.environ['MY_TOKEN'])"
    )
    model.load(
        script(
            sql_call("SELECT 1", datasource="nope"),
            sql_call("SELECT * FROM missing_table"),
            {"tool_calls": [{"name": "run_python", "arguments": {"code": code}}]},
        )
    )
    env = {
        **datasource_env("shop", "sqlite", f"sqlite:///{shop_sqlite}"),
        "KEY_COPY": "sk-runtime-test",
        "MY_TOKEN": "the user's own",
    }
    runtime = start("paw-agent", env=env)
    runtime.ready()
    lines = runtime.submit("oops", timeout=120)
    assert tool_results(model) == [
        "error: no datasource 'nope'; the datasources are: shop",
        # Checked before running (EXPLAIN QUERY PLAN): sent back, not run.
        "error: not run; the check before running refused it: SQLite error: no such table: "
        "missing_table\n\nCorrect the statement and call run_sql again (1 more may be sent "
        "back in this run; then statements run unchecked).",
        # The code sees neither the provider key nor the datasource URLs, only the rest.
        "[] the user's own",
    ]
    assert [t["ok"] for t in notifies(lines, "tool")] == [False, False, True]


TABLE = "runtime_scratch_tips"  # in this session's own test database


@pytest.fixture
def scratch_table(django_db_setup, django_db_blocker) -> Iterator[str]:
    """The test database's URL, with a scratch table ``runtime_scratch_tips`` of three rows,
    a sequence ``runtime_scratch_tips_seq`` and a view ``runtime_scratch_tips_next`` that
    calls its ``nextval``, dropped afterwards."""
    with django_db_blocker.unblock():
        url = worker_database_url()
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("DROP VIEW IF EXISTS runtime_scratch_tips_next")
        connection.execute("DROP TABLE IF EXISTS runtime_scratch_tips")
        connection.execute("DROP SEQUENCE IF EXISTS runtime_scratch_tips_seq")
        connection.execute(
            "CREATE TABLE runtime_scratch_tips (id serial PRIMARY KEY, day text, tip numeric)"
        )
        connection.execute("CREATE SEQUENCE runtime_scratch_tips_seq")
        connection.execute(
            "CREATE VIEW runtime_scratch_tips_next AS "
            "SELECT nextval('runtime_scratch_tips_seq') AS next"
        )
        connection.execute(
            "INSERT INTO runtime_scratch_tips (day, tip) VALUES "
            "('Sat', 2.5), ('Sun', 3.5), ('Sun', 3.0)"
        )
    yield url
    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("DROP VIEW IF EXISTS runtime_scratch_tips_next")
        connection.execute("DROP TABLE IF EXISTS runtime_scratch_tips")
        connection.execute("DROP SEQUENCE IF EXISTS runtime_scratch_tips_seq")


@pytest.mark.django_db  # makes pytest-django create the test database
def test_postgresql_read_runs_read_only_and_write_runs_once_approved(start, model, scratch_table):
    url = scratch_table
    model.load(
        script(
            sql_call(
                "SELECT day, avg(tip)::numeric(4,2) AS tip FROM runtime_scratch_tips "
                "GROUP BY day ORDER BY day",
                datasource="tips_db",
            ),
            # A read by the parser's rule (a view), but the view changes the sequence: the
            # read-only transaction refuses it (the database's own wall).
            sql_call("SELECT * FROM runtime_scratch_tips_next", datasource="tips_db"),
            sql_call(
                "UPDATE runtime_scratch_tips SET tip = tip + 1 WHERE day = 'Sat'",
                datasource="tips_db",
            ),
        )
    )
    runtime = start("paw-agent", env=datasource_env("tips_db", "postgresql", url))
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "tips", "run_id": "r1"})
    ask = runtime.wait_for(lambda x: x.get("kind") == "ask")["data"]
    assert ask["prompt"].endswith(
        "\nUPDATE runtime_scratch_tips SET tip = tip + 1 WHERE day = 'Sat'"
    )
    runtime.send({"op": "answer", "run_id": "r1", "answers": ["y"], "ask_id": ask["ask_id"]})
    runtime.run_lines("r1")
    read, sneaky, write = tool_results(model)
    assert read == "| day | tip |\n|---|---|\n| Sat | 2.50 |\n| Sun | 3.25 |\n\n(2 rows)"
    assert sneaky.startswith("error: PostgreSQL error:") and "read-only transaction" in sneaky
    assert write == "statement executed (UPDATE 1); 1 rows changed"
    with psycopg.connect(url) as connection:
        assert (
            connection.execute("SELECT tip FROM runtime_scratch_tips WHERE day = 'Sat'").fetchone()[
                0
            ]
            == 3.5
        )
        assert connection.execute(
            "SELECT last_value, is_called FROM runtime_scratch_tips_seq"
        ).fetchone() == (1, False)
        assert connection.execute("SELECT count(*) FROM runtime_scratch_tips").fetchone()[0] == 3


@pytest.mark.django_db
def test_the_urls_own_postgresql_options_stay_beside_the_statement_timeout(
    start, model, scratch_table
):
    """A read-only datasource's URL carries ``default_transaction_read_only``: the runtime's
    statement timeout is added to those options, so even an approved write is refused."""
    url = f"{scratch_table}?options={quote('-c default_transaction_read_only=on')}"
    update = "UPDATE runtime_scratch_tips SET tip = 0"
    model.load(script(sql_call(update, datasource="tips_db")))
    runtime = start("paw-agent", env=datasource_env("tips_db", "postgresql", url))
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "zero the tips", "run_id": "r1"})
    approve_every_confirm(runtime, "r1")
    [result] = tool_results(model)
    assert "read-only transaction" in result
    with psycopg.connect(scratch_table) as connection:
        assert (
            connection.execute(
                "SELECT count(*) FROM runtime_scratch_tips WHERE tip = 0"
            ).fetchone()[0]
            == 0
        )


@pytest.mark.django_db
def test_row_cap_on_postgresql(start, model, scratch_table):
    url = scratch_table
    model.load(script(sql_call("SELECT g FROM generate_series(1, 500) AS g", datasource="db")))
    runtime = start("paw-agent", env=datasource_env("db", "postgresql", url))
    runtime.ready()
    runtime.submit("many rows")
    (result,) = tool_results(model)
    assert result.count("\n| ") == 200
    assert result.endswith("(first 200 of 500 rows shown; row cap 200)")


# --- MySQL / MariaDB (the test server's own database) -------------------------------------


def test_mariadb_reads_stream_read_only_and_writes_run_once_approved(start, model, mariadb):
    model.load(
        script(
            sql_call("SELECT day, SUM(total) AS total FROM shop_orders GROUP BY day ORDER BY day"),
            sql_call("SELECT * FROM shop_totals ORDER BY day"),
            sql_call("UPDATE shop_orders SET total = total + 1 WHERE day = 'Sat'"),
            sql_call("SELEC oops"),
        )
    )
    runtime = start("paw-agent", env=datasource_env("shop", "mysql", mariadb_database_url()))
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "orders", "run_id": "r1"})
    lines = approve_every_confirm(runtime, "r1")
    read, view, write, broken = tool_results(model)
    assert read == "| day | total |\n|---|---|\n| Sat | 20.50 |\n| Sun | 43.25 |\n\n(2 rows)"
    assert view == read
    assert write == "statement executed; 1 rows changed"
    assert broken.startswith("error: MySQL error:") and "syntax" in broken
    # Not a read, so not run before it is approved: the UPDATE and the broken statement.
    update, _ = [line["data"]["prompt"] for line in lines if line.get("kind") == "ask"]
    assert update == (
        "run_sql on The shop (shop, mysql) — this statement is not a read, so it may change "
        "data: it is an UPDATE statement; a read is one SELECT, WITH or EXPLAIN.\n"
        "UPDATE shop_orders SET total = total + 1 WHERE day = 'Sat'"
    )
    with mariadb_cursor() as cursor:
        cursor.execute("SELECT total FROM shop_orders WHERE day = 'Sat'")
        assert cursor.fetchone()[0] == Decimal("21.50")


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked"])
@pytest.mark.parametrize("read_only", [False, True], ids=["writable", "read-only"])
def test_a_mariadb_read_cannot_write(start, model, mariadb, read_only, checked):
    """A function with a side effect behind a view is a read by the parser's rule (it
    reads a view), and runs in a READ ONLY transaction (and, on a read-only datasource, a
    READ ONLY session): the database's own wall refuses the write. MariaDB's EXPLAIN
    calls the view's function while planning: the check's EXPLAIN (the default) meets the
    same wall, and the statement is sent back unrun; without the check (``--sql-retries
    0``) the statement itself does."""
    with mariadb_cursor() as cursor:
        cursor.execute("DROP VIEW IF EXISTS shop_sneaky_view")
        cursor.execute("DROP FUNCTION IF EXISTS shop_sneaky")
        cursor.execute(
            "CREATE FUNCTION shop_sneaky() RETURNS INT MODIFIES SQL DATA"
            " BEGIN INSERT INTO shop_customers VALUES (9, 'Mallory'); RETURN 1; END"
        )
        cursor.execute("CREATE VIEW shop_sneaky_view AS SELECT shop_sneaky() AS sneaky")
    try:
        model.load(script(sql_call("SELECT * FROM shop_sneaky_view")))
        env = datasource_env("shop", "mysql", mariadb_database_url(), read_only=read_only)
        runtime = start("paw-agent", *(() if checked else ("--sql-retries", "0")), env=env)
        runtime.ready()
        runtime.submit("sneak")
        [sneaky] = tool_results(model)
        prefix = "error: not run; the check before running refused it: " if checked else "error: "
        assert sneaky.startswith(prefix + "MySQL error:") and "READ ONLY" in sneaky.upper()
    finally:
        with mariadb_cursor() as cursor:
            cursor.execute("DROP VIEW IF EXISTS shop_sneaky_view")
            cursor.execute("DROP FUNCTION IF EXISTS shop_sneaky")
    with mariadb_cursor() as cursor:
        cursor.execute("SELECT count(*) FROM shop_customers")
        assert cursor.fetchone()[0] == 2


def test_mariadb_statement_time_limit_and_cancel(start, model, mariadb):
    model.load(script(sql_call("SELECT SLEEP(30)")))
    runtime = start(
        "paw-agent",
        "--tool-timeout",
        "1",
        env=datasource_env("shop", "mysql", mariadb_database_url()),
    )
    runtime.ready()
    # SLEEP is not on the allow-list (not a read): it runs once approved.
    runtime.send({"op": "submit", "prompt": "slow", "run_id": "r1"})
    approve_every_confirm(runtime, "r1")
    [slow] = tool_results(model)
    # The tool's time limit is the server's max_statement_time (MySQL: max_execution_time).
    assert (
        slow == "error: MySQL error: Query execution was interrupted (max_statement_time exceeded)"
    )
    model.load(script(sql_call("SELECT SLEEP(30)")))
    runtime.send({"op": "submit", "prompt": "slow again", "run_id": "r2"})
    ask = runtime.wait_for(lambda x: x.get("kind") == "ask")["data"]
    runtime.send({"op": "answer", "run_id": "r2", "answers": ["y"], "ask_id": ask["ask_id"]})

    def sleeping() -> bool:
        with mariadb_cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM information_schema.processlist "
                "WHERE info = 'SELECT SLEEP(30)'"
            )
            return cursor.fetchone()[0] > 0

    wait_for(sleeping, what="the approved SLEEP running on the server")
    runtime.send({"op": "cancel", "run_id": "r2"})
    result = runtime.wait_for(lambda x: x.get("type") == "result", timeout=10)
    assert result["cancelled"] is True


@pytest.mark.django_db
def test_structured_results_are_real_json_values_on_postgresql():
    """jsonb and arrays as JSON (recursively), an interval an ISO 8601 duration, a numeric
    a float only when exact, else its exact text: what the host stores is what the
    database said."""
    from paw_agent.control import RunControl
    from paw_agent.sql import Datasource, run_query

    source = Datasource("db", "DB", "postgresql", "", worker_database_url(), read_only=True)
    sql = (
        'SELECT \'{"a": [1, 2], "b": {"c": null, "d": 1.5}}\'::jsonb AS doc,'
        " ARRAY[1, 2] AS ints, ARRAY['2024-01-02'::date] AS days,"
        " interval '1 day 2 hours' AS span, interval '-90 minutes' AS back,"
        " interval '1.5 seconds' AS blink, interval '0' AS nothing,"
        " 12345678901234567890.123::numeric AS big, 21.50::numeric AS price,"
        " 12345678901234567890::numeric AS huge, 0.1::numeric AS tenth"
    )
    control = RunControl()
    result = run_query(source, sql, read_only=True, timeout=10, control=control)
    structured = result.structured(datasource="db", sql=sql, rows=5)
    row = dict(zip(structured["columns"], structured["rows"][0], strict=True))
    assert row == {
        "doc": {"a": [1, 2], "b": {"c": None, "d": 1.5}},
        "ints": [1, 2],
        "days": ["2024-01-02"],
        "span": "P1DT2H",
        "back": "-PT1H30M",
        "blink": "PT1.5S",
        "nothing": "PT0S",
        "big": "12345678901234567890.123",
        "price": 21.5,
        "huge": "12345678901234567890",
        "tenth": 0.1,
    }
    # It survives a JSON round trip unchanged, and the model's table shows JSON too.
    assert json.loads(json.dumps(structured)) == structured
    table = result.text()
    assert '{"a": [1, 2], "b": {"c": null, "d": 1.5}}' in table and "P1DT2H" in table
