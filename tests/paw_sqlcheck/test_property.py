"""Property-based tests of the rule of a read against the real databases.

- Writes and side-effect calls with comments and literals of every form mixed in, each one
  valid on its database (the database plans it: ``EXPLAIN``, rolled back), are never
  judged reads.
- Reads whose comments and literals hold the *text* of such calls, when judged reads, run
  on the database without running any of them: PostgreSQL's probe setting stays unset,
  MariaDB's probe variable stays NULL, SQLite's authorizer sees only allow-listed
  functions. A parser that read a comment or a string differently from the database
  would fail here.

Hypothesis runs derandomized (the same examples every run: a failure repeats, a pass is
not luck) and its health check fails a generator that yields mostly invalid SQL.
"""

from __future__ import annotations

import contextlib
import sqlite3

import pytest
from hypothesis import HealthCheck, assume, given, settings

from paw_sqlcheck import POSTGRESQL_SESSION_OPTIONS, judge, mysql_sql_mode
from paw_sqlcheck.allowlist import FUNCTIONS
from tests.paw_sqlcheck.strategies import attack, hiding_read

PROPERTY = settings(
    max_examples=150,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="module")
def pg():
    """An autocommit connection to the datasource test database with ``paw_probe (a int)``,
    set as paw-agent sets its sessions (``POSTGRESQL_SESSION_OPTIONS``)."""
    import psycopg

    from tests.pgdatasource import pg_datasource_settings

    server = pg_datasource_settings(reader=False)
    with psycopg.connect(
        host=server["host"], port=server["port"], user=server["user"],
        dbname=server["database"], autocommit=True, options=POSTGRESQL_SESSION_OPTIONS,
    ) as conn:  # fmt: skip
        conn.execute("DROP TABLE IF EXISTS paw_probe")
        conn.execute("CREATE TABLE paw_probe (a int)")
        yield conn
        conn.execute("DROP TABLE IF EXISTS paw_probe")


@pytest.fixture(scope="module")
def maria():
    """A MariaDB connection to the test database with ``paw_probe (a int)``, its sql_mode
    set as paw-agent sets it."""
    from tests.mariadb import _connect

    conn = _connect()
    with conn.cursor() as cursor:
        cursor.execute("SELECT @@SESSION.sql_mode")
        cursor.execute("SET SESSION sql_mode = %s", (mysql_sql_mode(cursor.fetchone()[0]),))
        cursor.execute("DROP TABLE IF EXISTS paw_probe")
        cursor.execute("CREATE TABLE paw_probe (a int)")
    conn.autocommit(False)
    yield conn
    with conn.cursor() as cursor:
        cursor.execute("DROP TABLE IF EXISTS paw_probe")
    conn.close()


def _sqlite() -> sqlite3.Connection:
    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE paw_probe (a int)")
    return conn


def _pg_plans(pg, sql: str) -> bool:
    """Whether PostgreSQL plans ``sql`` (valid, its functions exist), run nowhere."""
    import psycopg

    try:
        with pg.transaction(force_rollback=True):
            pg.execute("EXPLAIN " + sql)
        return True
    except psycopg.Error:
        return False


def _maria_plans(maria, sql: str) -> bool:
    import pymysql

    try:
        with maria.cursor() as cursor:
            cursor.execute("EXPLAIN " + sql)
        return True
    except pymysql.MySQLError:
        return False
    finally:
        maria.rollback()


def _sqlite_plans(sql: str) -> bool:
    with contextlib.closing(_sqlite()) as conn:
        try:
            conn.execute("EXPLAIN " + sql)  # compiles to bytecode, runs nothing
            return True
        except (sqlite3.Error, sqlite3.Warning):
            return False


@PROPERTY
@given(statement=attack("postgresql"))
def test_postgresql_attacks_are_never_reads(pg, statement):
    assume(_pg_plans(pg, statement))
    assert not judge(statement, dialect="postgresql").read, statement


@PROPERTY
@given(statement=attack("mysql"))
def test_mariadb_attacks_are_never_reads(maria, statement):
    assume(_maria_plans(maria, statement))
    assert not judge(statement, dialect="mysql").read, statement


@PROPERTY
@given(statement=attack("sqlite"))
def test_sqlite_attacks_are_never_reads(statement):
    assume(_sqlite_plans(statement))
    assert not judge(statement, dialect="sqlite").read, statement


@PROPERTY
@given(statement=hiding_read("postgresql"))
def test_a_postgresql_read_runs_none_of_the_calls_it_hides(pg, statement):
    assume(judge(statement, dialect="postgresql").read)
    with pg.transaction(force_rollback=True):
        pg.execute("SET TRANSACTION READ ONLY")
        pg.execute(statement)
        probe = pg.execute("SELECT current_setting('paw.probe', true)").fetchone()[0]
        locks = pg.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
        ).fetchone()[0]
    assert (probe or "") != "hit", statement
    assert locks == 0, statement


@PROPERTY
@given(statement=hiding_read("mysql"))
def test_a_mariadb_read_runs_none_of_the_calls_it_hides(maria, statement):
    assume(judge(statement, dialect="mysql").read)
    with maria.cursor() as cursor:
        cursor.execute("SET @paw_probe = NULL")
        cursor.execute("START TRANSACTION READ ONLY")
        cursor.execute(statement)
        cursor.fetchall()
        maria.rollback()
        cursor.execute("SELECT @paw_probe, IS_FREE_LOCK('paw')")
        probe, free = cursor.fetchone()
    assert probe is None, statement
    assert free == 1, statement


@PROPERTY
@given(statement=hiding_read("sqlite"))
def test_a_sqlite_read_calls_only_allow_listed_functions(statement):
    assume(judge(statement, dialect="sqlite").read)
    seen: list[tuple[int, str | None]] = []

    def authorizer(action: int, arg1, arg2, database, trigger) -> int:
        seen.append((action, arg2 if action == sqlite3.SQLITE_FUNCTION else arg1))
        return sqlite3.SQLITE_OK

    with contextlib.closing(_sqlite()) as conn:
        conn.set_authorizer(authorizer)
        conn.execute(statement).fetchall()
    allowed = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION}
    assert {action for action, _ in seen} <= allowed, (statement, seen)
    called = {name.lower() for action, name in seen if action == sqlite3.SQLITE_FUNCTION}
    assert called <= FUNCTIONS["sqlite"], (statement, called)
