"""Side effects dressed as reads, through paw-agent's ``run_sql`` on the real databases.

Issue 25 found these running on a read-only datasource without an approval: reading the
database server's files, killing another client's session, settings, advisory locks,
notifications. Each database here is reached as its *superuser* on purpose: the parser's
rule alone must refuse them (the database's own wall, a read-only user, is tested
apart: ``tests/secrets_vault/test_datasource_privileges.py``). On a read-only datasource
each is refused without asking; on a writable one each asks, and a decline runs nothing.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
from pathlib import Path

import psycopg
import pytest

from paw_sqlcheck import judge
from tests.mariadb import mariadb_cursor, mariadb_database_url
from tests.paw_agent.driver import notifies
from tests.paw_agent.test_sql import datasource_env, script, tool_results
from tests.paw_sqlcheck.corpus import ATTACKS, DIALECT_ATTACKS, NBSP
from tests.pgdatasource import pg_datasource_settings

#: Issue 25's findings, verbatim.
ISSUE_FINDINGS = [
    "SELECT pg_read_file/**/('/etc/hostname') AS f",
    "SELECT pg_terminate_backend/**/(pid) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid()",
    "SELECT set_config/**/('default_transaction_read_only','off',false), "
    "pg_advisory_lock/**/(42), pg_notify/**/('ch','x')",
    "SELECT pg_read_file--x\n('/etc/hostname')",
    "SELECT E'\\'', pg_read_file('/etc/hostname')",
]
REFUSED = "error: datasource {slug} is read-only and this statement is not a read: "
#: The check before running sends back a statement the parser cannot parse (the first
#: ``--sql-retries`` of a run), before the read-only rule is reached: not run either.
SENT_BACK = "error: not run; the check before running refused it: the statement does not parse: "
#: The second adversarial pass: ``q.f`` of a function ``q`` in FROM that has no column
#: ``f`` is the call ``f(q)`` on PostgreSQL, with the value the function returned.
#: Each statement → the advisory lock it takes.
ROW_FUNCTION_CALLS = {
    "SELECT q.pg_advisory_lock FROM int8(4242) AS q": 4242,
    "SELECT q.ts_stat FROM concat('SELECT to_tsvector(pg_advisory_lock(4243)::text)') AS q": 4243,
    "SELECT g.pg_advisory_lock FROM generate_series(4244, 4244) AS g": 4244,
    "SELECT generate_series.pg_advisory_lock FROM generate_series(4245, 4245)": 4245,
    "SELECT 1 FROM generate_series(1, 1) AS g, LATERAL int8(4246) AS k "
    "WHERE k.pg_advisory_lock IS NULL": 4246,
}


def calls(queries: list[str], datasource: str) -> dict:
    """One model turn calling ``run_sql`` once per query, in order."""
    return {
        "tool_calls": [
            {"name": "run_sql", "arguments": {"datasource": datasource, "query": query}}
            for query in queries
        ]
    }


def decline_every_confirm(runtime, run_id: str) -> list[dict]:
    """Run ``run_id`` to its result, declining each confirm it asks; the asks."""
    asks = []
    while True:
        line = runtime.wait_for(lambda x: x.get("kind") == "ask" or x.get("type") == "result")
        if line.get("type") == "result":
            return asks
        asks.append(line["data"])
        runtime.send(
            {"op": "answer", "run_id": run_id, "answers": ["no"], "ask_id": line["data"]["ask_id"]}
        )


@pytest.fixture
def pg_superuser():
    """The datasource test database as its superuser: ``(url, connect)``, with a table
    ``attack_orders`` (2 rows) and a sequence ``attack_seq``, dropped afterwards."""
    server = pg_datasource_settings(reader=False)
    url = f"postgresql://{server['user']}@{server['host']}:{server['port']}/{server['database']}"

    def connect(**more):
        return psycopg.connect(url, autocommit=True, **more)

    with connect() as conn:
        conn.execute("DROP TABLE IF EXISTS attack_orders")
        conn.execute("DROP SEQUENCE IF EXISTS attack_seq")
        conn.execute("CREATE TABLE attack_orders (id int PRIMARY KEY, total numeric)")
        conn.execute("INSERT INTO attack_orders VALUES (1, 10), (2, 20)")
        conn.execute("CREATE SEQUENCE attack_seq")
    yield url, connect
    with connect() as conn:
        conn.execute("DROP TABLE IF EXISTS attack_orders")
        conn.execute("DROP SEQUENCE IF EXISTS attack_seq")


def _pg_state(connect) -> tuple:
    """What the attacks would change, as another client sees it."""
    with connect() as conn:
        rows = conn.execute("SELECT count(*), sum(total) FROM attack_orders").fetchone()
        sequence = conn.execute("SELECT last_value, is_called FROM attack_seq").fetchone()
        objects = conn.execute("SELECT count(*) FROM pg_largeobject_metadata").fetchone()[0]
        locks = conn.execute(  # this database's only: another session's tests hold their own
            "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND d.datname = current_database()"
        )
        return rows, sequence, objects, locks.fetchone()[0]


def _pg_queries(tmp_path: Path) -> tuple[list[str], Path]:
    marker = tmp_path / f"program-{secrets.token_hex(4)}"
    queries = [
        *ISSUE_FINDINGS,
        "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_stat_activity "
        "WHERE pid <> pg_backend_pid()",
        'SELECT "pg_cancel_backend"(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid()',
        "SELECT lo_import('/etc/hostname')",
        "SELECT nextval('attack_seq')",
        "WITH gone AS (DELETE FROM attack_orders RETURNING *) SELECT count(*) FROM gone",
        "EXPLAIN ANALYZE DELETE FROM attack_orders",
        "SELECT * FROM attack_orders FOR UPDATE",
        "SELECT query_to_xml('SELECT pg_read_file(''/etc/hostname'')', true, true, '')",
        f"COPY (SELECT 1) TO PROGRAM 'touch {marker}'",
        "DO $$ BEGIN PERFORM pg_advisory_lock(42); END $$",
        "SELECT 1; DELETE FROM attack_orders",
        # The adversarial pass's findings: a Unicode space before a dollar quote, and a
        # field of an expression, which PostgreSQL reads as a function call.
        f"SELECT interval{NBSP}$a$, pg_advisory_lock(42) AS z{NBSP}$a$ "
        f'FROM (SELECT 1 AS "interval{NBSP}$a$") AS t',
        "SELECT (42).pg_advisory_lock",
        "SELECT (q).ts_stat FROM (SELECT 'SELECT to_tsvector(pg_advisory_lock(42)::text)' AS q) t",
        # The second adversarial pass: a function in FROM named with a "column" it lacks.
        *ROW_FUNCTION_CALLS,
    ]
    return queries, marker


def _pg_reader(**more):
    """The datasource test database as its read-only user, in read-only transactions."""
    settings = pg_datasource_settings()
    return psycopg.connect(
        host=settings["host"], port=settings["port"], user=settings["user"],
        dbname=settings["database"], options="-c default_transaction_read_only=on", **more,
    )  # fmt: skip


@pytest.mark.django_db
@pytest.mark.parametrize(("sql", "key"), ROW_FUNCTION_CALLS.items())
def test_a_function_reached_as_a_column_of_a_function_in_from_runs_and_is_refused(sql, key):
    """On the real server, as the read-only user in a read-only transaction, each of
    these takes an advisory lock (the adversarial pass: they were judged reads). The
    judge refuses each, naming the call PostgreSQL makes."""
    with _pg_reader() as conn:
        conn.execute(sql).fetchall()
        held = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
            "AND pid = pg_backend_pid()",
            [key],
        ).fetchone()[0]
        assert held == 1, sql  # what the database does: the function ran
    verdict = judge(sql, dialect="postgresql")
    assert (verdict.read, verdict.code) == (False, "function_of_row"), verdict
    assert "pg_advisory_lock(" in verdict.reason or "ts_stat(q)" in verdict.reason


@pytest.mark.django_db
def test_a_schema_qualified_function_in_from_is_refused():
    sql = "SELECT * FROM pg_catalog.generate_series(1, 2)"
    with _pg_reader() as conn:
        assert conn.execute(sql).fetchall() == [(1,), (2,)]  # the database runs it
    verdict = judge(sql, dialect="postgresql")
    assert (verdict.read, verdict.code) == (False, "qualified_function")
    # The same function, by its plain name and with its own columns, is a read.
    assert judge("SELECT g.g FROM generate_series(1, 2) AS g", dialect="postgresql").read
    assert judge("SELECT j.key FROM jsonb_each('{}') AS j", dialect="postgresql").read


KELVIN = "\u212a"  # K: "k" in Python's lower case, a letter of its own to PostgreSQL
#: Calls of user-defined functions the judge took for built-in ones (the second pass):
#: the statement, the function the database's owner made, the advisory lock it takes.
LOOKALIKE_CALLS = [
    (f"SELECT ran{KELVIN}()", f'"ran{KELVIN}"()', 4250),
    ("SELECT if(true, 1, 2)", '"if"(boolean, int, int)', 4251),
    ("SELECT ts_or_ds_to_date_str(1)", "ts_or_ds_to_date_str(int)", 4252),
    ("SELECT var_map(1, 2)", "var_map(int, int)", 4253),
    ("SELECT iif(true, 1, 2)", "iif(boolean, int, int)", 4254),
]


@pytest.fixture
def pg_lookalike_functions(pg_superuser):
    """The functions of :data:`LOOKALIKE_CALLS`, made by the superuser in ``public``
    (executable by everyone, as PostgreSQL makes them), dropped afterwards."""
    _url, connect = pg_superuser
    with connect() as conn:
        for _sql, signature, key in LOOKALIKE_CALLS:
            conn.execute(
                f"CREATE OR REPLACE FUNCTION public.{signature} RETURNS int LANGUAGE sql "
                f"AS 'SELECT 1 FROM pg_advisory_lock({key})'"
            )
    yield
    with connect() as conn:
        for _sql, signature, _key in LOOKALIKE_CALLS:
            conn.execute(f"DROP FUNCTION IF EXISTS public.{signature}")


@pytest.mark.django_db
@pytest.mark.parametrize(("sql", "signature", "key"), LOOKALIKE_CALLS, ids=lambda v: str(v)[:30])
def test_a_user_defined_function_named_like_a_built_in_one_runs_and_is_refused(
    pg_lookalike_functions, sql, signature, key
):
    """A Unicode look-alike of an allowed name, and names the parser turns into nodes
    judged by kind (``IF(`` → ``If``, ``VAR_MAP(`` → ``Array``, ``TS_OR_DS_TO_DATE_STR(``
    → ``Cast``): each calls the user-defined function on the real server, as the
    read-only user. The judge checks every such name against the list, and only ASCII
    names are on it."""
    with _pg_reader() as conn:
        assert conn.execute(sql).fetchone() == (1,)
        held = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
            "AND pid = pg_backend_pid()",
            [key],
        ).fetchone()[0]
        assert held == 1, sql  # the user-defined function ran
    verdict = judge(sql, dialect="postgresql")
    assert (verdict.read, verdict.code) == (False, "function"), verdict
    assert "not on the list" in verdict.reason or "not a plain ASCII name" in verdict.reason


@pytest.mark.django_db
def test_the_tables_that_hold_passwords_are_refused_by_name(pg_superuser, mariadb):
    """The second pass: the judge let ``SELECT … FROM pg_authid`` / ``mysql.user`` pass
    as reads. A user PAW was told to accept anyway (a superuser) reads password hashes
    there, on the real servers; the judge refuses every form of their names."""
    _url, connect = pg_superuser
    with connect() as conn:
        assert conn.execute("SELECT count(*) FROM pg_authid WHERE rolpassword IS NOT NULL "
                            "OR rolpassword IS NULL").fetchone()[0] > 0  # fmt: skip
        conn.execute("SELECT count(*) FROM pg_catalog.pg_shadow").fetchone()
        conn.execute("SELECT count(*) FROM pg_user_mappings").fetchone()
        conn.execute("SELECT count(*) FROM pg_largeobject").fetchone()
    for sql in (
        "SELECT rolname, rolpassword FROM pg_authid",
        'SELECT * FROM pg_catalog."pg_shadow"',
        "TABLE pg_user_mappings",
        "SELECT (SELECT count(*) FROM PG_LARGEOBJECT) AS n",
        "WITH r AS (SELECT * FROM pg_authid) SELECT * FROM r",
    ):
        verdict = judge(sql, dialect="postgresql")
        assert (verdict.read, verdict.code) == (False, "secret_table"), verdict
    with mariadb_cursor() as cursor:
        cursor.execute("SELECT count(*) FROM mysql.global_priv")
        assert cursor.fetchone()[0] > 0
    for sql in (
        "SELECT User, authentication_string FROM mysql.user",
        "SELECT * FROM `mysql`.`global_priv`",
        "SELECT * FROM MySQL.User",
    ):
        verdict = judge(sql, dialect="mysql")
        assert (verdict.read, verdict.code) == (False, "secret_table"), verdict
    # A table of the same name in another database is an ordinary read.
    assert judge("SELECT * FROM shop.user", dialect="mysql").read


#: PostgreSQL functions whose argument is a size: each makes a 100 MB value at once here.
PG_AMPLIFIERS = [
    "SELECT length(repeat('x', 100000000))",
    "SELECT length(lpad('', 100000000, 'x'))",
    "SELECT length(rpad('', 100000000, 'x'))",
    "SELECT length(format('%100000000s', 'x'))",
    "SELECT cardinality(array_fill(1, ARRAY[100000000]))",
]


@pytest.mark.django_db
def test_postgresql_functions_that_allocate_what_they_are_asked_are_refused():
    """The second pass: repeat / lpad / rpad / format's width / array_fill make a value
    of any size up to 1 GB from a few bytes of SQL. On the real server, as the read-only
    user with the smallest work_mem and a statement timeout, each makes its 100 MB (or
    100 million elements): neither setting bounds it. The judge refuses each; the
    functions that stay (generate_series, string_agg) grow with the rows read."""
    with _pg_reader(autocommit=True) as conn:
        conn.execute("SET work_mem = '64kB'")
        conn.execute("SET statement_timeout = '20s'")
        for sql in PG_AMPLIFIERS:
            assert conn.execute(sql).fetchone()[0] == 100_000_000, sql
    for sql in PG_AMPLIFIERS:
        verdict = judge(sql, dialect="postgresql")
        assert (verdict.read, verdict.code) == (False, "function"), verdict
    assert judge(
        "SELECT string_agg(g::text, ',') FROM generate_series(1, 10) AS g", dialect="postgresql"
    ).read


@pytest.mark.django_db  # the datasource test database's name follows the test database's
def test_postgresql_side_effects_are_refused_on_a_read_only_datasource_without_asking(
    start, model, pg_superuser, tmp_path
):
    url, connect = pg_superuser
    queries, marker = _pg_queries(tmp_path)
    before = _pg_state(connect)
    with connect() as victim, connect() as listener:
        listener.execute("LISTEN ch")
        victim_pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
        model.load(script(calls(queries, "pg")))
        runtime = start("paw-agent", env=datasource_env("pg", "postgresql", url, read_only=True))
        runtime.ready()
        lines = runtime.submit("attack", timeout=120)
        assert notifies(lines, "ask") == []  # nothing to approve: it cannot happen
        results = tool_results(model)
        assert len(results) == len(queries)
        for query, result in zip(queries, results, strict=True):
            assert result.startswith(REFUSED.format(slug="pg")), (query, result)
        # Each says why: the function it calls, the write it holds.
        assert "pg_read_file()" in results[0] and "pg_terminate_backend()" in results[1]
        assert "set_config()" in results[2] and "pg_read_file()" in results[3]
        # The other client's session lives, heard nothing, and nothing changed.
        assert victim.execute("SELECT pg_backend_pid()").fetchone()[0] == victim_pid
        assert list(listener.notifies(timeout=0.2, stop_after=1)) == []
    assert _pg_state(connect) == before
    assert not marker.exists()


@pytest.mark.django_db
def test_postgresql_side_effects_ask_on_a_writable_datasource_and_a_decline_runs_nothing(
    start, model, pg_superuser, tmp_path
):
    url, connect = pg_superuser
    queries, marker = _pg_queries(tmp_path)
    before = _pg_state(connect)
    model.load(script(calls(queries, "pg")))
    runtime = start("paw-agent", env=datasource_env("pg", "postgresql", url))
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "attack", "run_id": "r1"})
    asks = decline_every_confirm(runtime, "r1")
    assert len(asks) == len(queries)
    for query, ask in zip(queries, asks, strict=True):
        assert ask["kind"] == "confirm"
        assert ask["prompt"].startswith(
            "run_sql on The shop (pg, postgresql) — this statement is not a read, so it may "
            "change data: it "
        )
        assert ask["prompt"].endswith("\n" + query.strip())
    assert all(result == "declined by the user" for result in tool_results(model))
    assert _pg_state(connect) == before
    assert not marker.exists()


@pytest.mark.parametrize("checked", [True, False], ids=["checked", "unchecked"])
def test_mariadb_side_effects_are_refused_on_a_read_only_datasource(start, model, mariadb, checked):
    """With the check before running (the default), the first two statements the parser
    cannot parse are sent back by it; every other one, and all of them without the check
    (``--sql-retries 0``), by the read-only rule. None runs."""
    target = f"/tmp/paw-attack-{secrets.token_hex(6)}"
    queries = [
        "SELECT LOAD_FILE('/etc/hostname')",
        "SELECT load_file # comment\n('/etc/hostname')",
        "SELECT GET_LOCK('paw_attack', 0)",
        "SELECT 1 /*!, GET_LOCK('paw_attack', 0) */",
        "SELECT 1 /*M!, GET_LOCK('paw_attack', 0) */",
        "SELECT 'a\\'', GET_LOCK('paw_attack', 0) -- '",
        f"SELECT 1 INTO OUTFILE '{target}'",
        "SELECT SLEEP(5)",
        "SELECT @v := 1",
        "SELECT * FROM shop_orders LOCK IN SHARE MODE",
        "SELECT 1; DELETE FROM shop_orders",
        "DELETE FROM shop_orders",
        f"SELECT t.x --{NBSP}, GET_LOCK('paw_attack', 0)\nFROM (SELECT 1 AS x) AS t",
        "SELECT count (id) FROM shop_orders",
        *MARIADB_REGEXPS,
    ]
    model.load(script(calls(queries, "shop")))
    env = datasource_env("shop", "mysql", mariadb_database_url(), read_only=True)
    runtime = start("paw-agent", *(() if checked else ("--sql-retries", "0")), env=env)
    runtime.ready()
    lines = runtime.submit("attack", timeout=120)
    assert notifies(lines, "ask") == []
    results = tool_results(model)
    unparsed = [q for q in queries if judge(q, dialect="mysql").code == "unparsed"]
    assert unparsed  # SELECT … INTO OUTFILE: sqlglot cannot parse it for MySQL
    sent_back = unparsed[:2] if checked else []
    for query, result in zip(queries, results, strict=True):
        expected = SENT_BACK if query in sent_back else REFUSED.format(slug="shop")
        assert result.startswith(expected), (query, result)
    assert "executable comment" in results[3] and "executable comment" in results[4]
    with mariadb_cursor() as cursor:
        cursor.execute("SELECT IS_FREE_LOCK('paw_attack'), count(*) FROM shop_orders")
        assert cursor.fetchone() == (1, 3)
    assert not os.path.exists(target)


#: A pattern PCRE backtracks on to its match limit, against a word that ends badly.
SUBJECT, PATTERN = "CONCAT(REPEAT('a', 30), '!')", "'^(\\\\w+\\\\s?)*$'"
MARIADB_REGEXPS = [
    f"SELECT {SUBJECT} REGEXP {PATTERN} AS m",
    f"SELECT {SUBJECT} RLIKE {PATTERN} AS m",
    f"SELECT {SUBJECT} NOT REGEXP {PATTERN} AS m",
    f"SELECT REGEXP_LIKE({SUBJECT}, {PATTERN}) AS m",
    f"SELECT REGEXP_SUBSTR({SUBJECT}, {PATTERN}) AS m",
    f"SELECT REGEXP_INSTR({SUBJECT}, {PATTERN}) AS m",
    f"SELECT REGEXP_REPLACE({SUBJECT}, {PATTERN}, 'x') AS m",
]


@pytest.mark.parametrize("sql", MARIADB_REGEXPS)
def test_mariadb_regular_expressions_backtrack_on_the_server_and_are_refused(mariadb, sql):
    """The second pass: MariaDB's REGEXP family runs PCRE, which backtracks on this
    pattern until its match limit (10 million steps) on each row; the server says so in a
    warning. Every form, operator or function, is refused by the judge."""
    with mariadb_cursor() as cursor:
        if "REGEXP_LIKE" in sql:  # MariaDB 10.11 has no REGEXP_LIKE: MySQL 8's
            cursor.execute("SELECT VERSION()")
        else:
            cursor.execute(sql)
            cursor.fetchall()
            cursor.execute("SHOW WARNINGS")
            assert any("match limit" in str(row[2]) for row in cursor.fetchall()), sql
    verdict = judge(sql, dialect="mysql")
    assert (verdict.read, verdict.code) == (False, "function"), verdict
    assert "regular expression" in verdict.reason or "regexp_" in verdict.reason


def test_sqlite_side_effects_are_refused_on_a_read_only_datasource(start, model, tmp_path):
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
        connection.execute("INSERT INTO orders (total) VALUES (1.5), (2.5)")
    evil = tmp_path / "evil.db"
    queries = [
        f"ATTACH DATABASE '{evil}' AS e",
        f"VACUUM INTO '{evil}'",
        "PRAGMA writable_schema = 1",
        "SELECT load_extension('/nowhere/x')",
        "SELECT [load_extension]('/nowhere/x')",
        "SELECT randomblob(100000000)",
        "WITH gone AS (DELETE FROM orders RETURNING *) SELECT * FROM gone",
        "SELECT 1; DELETE FROM orders",
        *DIALECT_ATTACKS["sqlite"],
    ]
    model.load(script(calls(queries, "shop")))
    # Read-write at the URL: the parser's rule is the wall being tested.
    runtime = start(
        "paw-agent", env=datasource_env("shop", "sqlite", f"sqlite:///{path}", read_only=True)
    )
    runtime.ready()
    lines = runtime.submit("attack", timeout=120)
    assert notifies(lines, "ask") == []
    for query, result in zip(queries, tool_results(model), strict=True):
        assert result.startswith(REFUSED.format(slug="shop")), (query, result)
    assert not evil.exists()
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT count(*) FROM orders").fetchone()[0] == 2


#: 10⁸ bytes from a 200-byte statement: each replace makes every "x" ten of them.
HUGE_REPLACE = "SELECT length(" + "replace(" * 8 + "'x'" + ", 'x', 'xxxxxxxxxx')" * 8 + ")"


def test_sqlite_values_are_bounded_where_judged_statements_run(tmp_path):
    """The second pass: SQLite builds any value a statement asks for — printf's width, a
    blob's size, replace of replace. The size-taking functions are not reads; what stays
    (replace, ||) is bounded by SQLITE_LIMIT_LENGTH on the connections that run judged
    statements, the server's (knowledge examples) and paw-agent's (run_sql)."""
    from paw_agent.control import RunControl
    from paw_agent.sql import Datasource, SqlError, run_query
    from paw_sqlcheck import SQLITE_MAX_LENGTH
    from secrets_vault.connections import database_connection

    path = tmp_path / "shop.sqlite3"
    with contextlib.closing(sqlite3.connect(path)) as plain:
        plain.execute("CREATE TABLE t (x)")
        # What the database does on its own: 100 MB from this statement, 10 MB of printf.
        assert plain.execute(HUGE_REPLACE).fetchone() == (10**8,)
        assert plain.execute("SELECT length(printf('%.*c', 10000000, 'x'))").fetchone() == (10**7,)
    for sql in (
        "SELECT printf('%.*c', 2000000000, 'x')",
        "SELECT format('%.*c', 2000000000, 'x')",
        "SELECT length(zeroblob(2000000000))",
        "SELECT length(randomblob(2000000000))",
    ):
        verdict = judge(sql, dialect="sqlite")
        assert (verdict.read, verdict.code) == (False, "function"), verdict
    assert judge(HUGE_REPLACE, dialect="sqlite").read  # a read: the connection bounds it
    with database_connection(
        dialect="sqlite", connection={"database": str(path)}, read_only=True, timeout=10
    ) as conn:
        assert conn.getlimit(sqlite3.SQLITE_LIMIT_LENGTH) == SQLITE_MAX_LENGTH
        with pytest.raises(sqlite3.DataError, match="too big"):
            conn.execute(HUGE_REPLACE).fetchone()
    source = Datasource("shop", "Shop", "sqlite", "", f"sqlite:///{path}", read_only=True)
    control = RunControl()
    try:
        with pytest.raises(SqlError, match="too big"):
            run_query(source, HUGE_REPLACE, read_only=True, timeout=10, control=control)
        small = run_query(source, "SELECT length(replace('xx', 'x', 'yy'))", read_only=True,
                          timeout=10, control=control)  # fmt: skip
        assert small.rows == [(4,)]
    finally:
        control.close()


def test_the_corpus_holds_every_statement_this_file_sends():
    """The queries sent here are attacks by the rule's own corpus too (one list of what
    must never be a read, used by the parser's tests on all three dialects)."""
    corpus = set(ATTACKS) | {q for attacks in DIALECT_ATTACKS.values() for q in attacks}
    assert set(ISSUE_FINDINGS) <= corpus
