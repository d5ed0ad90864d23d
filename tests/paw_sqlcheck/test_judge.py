"""The rule of a read (``paw_sqlcheck.judge``) on its own: everyday reads are reads, the
attack corpus is not, in every dialect; the reasons name what is wrong; the allow-lists
hold only what they say."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import sqlglot
from sqlglot import exp

from paw_sqlcheck import (
    MAX_NESTING,
    MAX_SQL_BYTES,
    MAX_SQL_CHARS,
    is_read,
    judge,
    mysql_mode_lexes_as_parsed,
    mysql_sql_mode,
)
from paw_sqlcheck.allowlist import FUNCTIONS, READ_NODES, SYNTAX_FUNCTIONS
from tests.paw_sqlcheck.corpus import ATTACKS, DIALECT_ATTACKS, READS

DIALECTS = ("postgresql", "mysql", "sqlite")
BIRD = Path(__file__).resolve().parents[2] / "sample_data" / "bird-minidev" / "questions.json"


@pytest.mark.parametrize(
    ("dialect", "sql"), [(d, sql) for d, reads in READS.items() for sql in reads]
)
def test_everyday_reads_are_reads(dialect, sql):
    verdict = judge(sql, dialect=dialect)
    assert verdict.read, verdict
    assert verdict.code == "read" and verdict.reason == ""


@pytest.mark.parametrize("dialect", DIALECTS)
@pytest.mark.parametrize("sql", ATTACKS)
def test_no_attack_is_a_read_in_any_dialect(dialect, sql):
    verdict = judge(sql, dialect=dialect)
    assert not verdict.read, verdict
    assert verdict.reason and verdict.code != "read"


@pytest.mark.parametrize(
    ("dialect", "sql"), [(d, sql) for d, attacks in DIALECT_ATTACKS.items() for sql in attacks]
)
def test_what_hides_in_a_dialects_own_comments_and_strings_is_found(dialect, sql):
    assert not judge(sql, dialect=dialect).read


def test_bird_gold_queries_are_reads():
    """BIRD mini-dev's 298 gold queries (written for SQLite by its experts, none for
    PAW) are reads on SQLite; translated by sqlglot to PostgreSQL and MySQL they are too,
    but for the SQLite-only ``julianday`` the translation keeps (no such function there)."""
    questions = json.loads(BIRD.read_text())
    assert len(questions) == 298
    refused = {dialect: [] for dialect in DIALECTS}
    for item in questions:
        verdict = judge(item["SQL"], dialect="sqlite")
        if not verdict.read:
            refused["sqlite"].append((item["SQL"], verdict.reason))
        for dialect, target in (("postgresql", "postgres"), ("mysql", "mysql")):
            translated = sqlglot.transpile(item["SQL"], read="sqlite", write=target)[0]
            verdict = judge(translated, dialect=dialect)
            if not verdict.read:
                refused[dialect].append(verdict.functions)
    assert refused["sqlite"] == []
    for dialect in ("postgresql", "mysql"):
        assert all("julianday" in functions for functions in refused[dialect]), refused
        assert len(refused[dialect]) <= 3


@pytest.mark.parametrize(
    ("sql", "code", "words"),
    [
        (
            "SELECT pg_read_file/**/('/etc/hostname') AS f",
            "function",
            "it calls pg_read_file(), which is not on the list of functions a read may call",
        ),
        ("SELECT name--x\n(1)", "function", "it calls name()"),
        ("SELECT \"lower\"('A')", "quoted_function", 'it calls "lower"() by a quoted name'),
        ("SELECT pg_catalog.lower('A')", "qualified_function", "schema-qualified"),
        ("DELETE FROM t", "not_a_query", "it is a DELETE statement"),
        ("UPDATE t SET a = 1", "not_a_query", "it is an UPDATE statement"),
        ("WITH d AS (DELETE FROM t RETURNING *) SELECT * FROM d", "writes", "a DELETE"),
        ("SELECT * INTO t2 FROM t", "writes", "it writes its rows into a table"),
        ("SELECT * FROM t FOR UPDATE", "writes", "it locks rows"),
        ("SELECT 1; SELECT 2", "several_statements", "several statements"),
        ("EXPLAIN ANALYZE DELETE FROM t", "not_a_query", "explains what is not a read"),
        ("SELECT (", "unparsed", "it cannot be parsed"),
        ("-- nothing", "empty", "only comments"),
    ],
)
def test_the_reason_says_what_makes_it_not_a_read(sql, code, words):
    verdict = judge(sql, dialect="postgresql")
    assert (verdict.read, verdict.code) == (False, code)
    assert words in verdict.reason, verdict.reason
    assert "\x1b" not in verdict.reason  # the parser's terminal colours are left out


def test_a_read_says_which_tables_and_functions_it_uses():
    verdict = judge(
        "WITH recent AS (SELECT * FROM sales.orders WHERE day > now() - interval '7 days') "
        "SELECT c.name, count(*), lower(c.city) FROM recent JOIN customers AS c USING (id) "
        "GROUP BY 1, 3",
        dialect="postgresql",
    )
    assert verdict.read
    assert verdict.tables == ("customers", "sales.orders")  # the CTE is not a table
    assert verdict.functions == ("count", "lower", "now")
    assert judge("EXPLAIN SELECT 1", dialect="mysql").explain is True
    assert judge("SELECT 1", dialect="mysql").explain is False


def test_what_cannot_be_judged_is_not_a_read_and_never_raises():
    assert judge("SELECT 1", dialect="oracle").code == "unknown_dialect"
    assert judge("SELECT " + "1 + " * (MAX_SQL_CHARS // 4) + "1", dialect="sqlite").code == (
        "too_long"
    )
    deep = "SELECT " + "(" * 5000 + "1" + ")" * 5000
    assert not judge(deep, dialect="postgresql").read
    assert not is_read("SELECT 'unterminated", dialect="mysql")
    assert is_read("SELECT 1", dialect="MariaDB")  # PAW's dialect names and their aliases


def _deep_call(depth: int, call):
    """``call()`` from ``depth`` more Python frames down (a caller's own stack)."""
    return _deep_call(depth - 1, call) if depth else call()


@pytest.mark.parametrize("dialect", DIALECTS)
def test_the_judge_bounds_what_it_parses_and_never_raises(dialect):
    """Found by the adversarial pass: ``SELECT a[1][1]…`` took quadratic time in the
    parser (3,000 subscripts: 20 s on PostgreSQL) and nested parentheses raised
    RecursionError inside it (about 40 levels). The length in bytes and the nesting are
    bounded before parsing, each with its own reason, and answered fast."""
    started = time.perf_counter()
    megabyte = "SELECT " + "1 + " * (1024 * 1024 // 4) + "1"
    verdict = judge(megabyte, dialect=dialect)
    assert (verdict.read, verdict.code) == (False, "too_long")
    assert f"longer than {MAX_SQL_BYTES:,} bytes" in verdict.reason
    # Bytes, not characters: 40,000 three-byte characters are 120,000 bytes.
    assert judge("SELECT '" + "東" * 40_000 + "'", dialect=dialect).code == "too_long"
    deep = {
        "parentheses": "SELECT " + "(" * 10_000 + "1" + ")" * 10_000,
        "subscripts": "SELECT a" + "[1]" * 10_000 + " FROM t",
        "case": "SELECT " + "CASE WHEN 1 = 1 THEN " * 3_000 + "1" + " END" * 3_000,
        "calls": "SELECT " + "lower(" * 10_000 + "'a'" + ")" * 10_000,
        "subqueries": "SELECT " + "(SELECT " * 5_000 + "1" + ")" * 5_000,
        "not": "SELECT " + "NOT " * 10_000 + "true",
    }
    for form, sql in deep.items():
        if dialect == "sqlite" and form == "subscripts":
            continue  # SQLite has no subscripts: unparsed, before any depth
        verdict = judge(sql, dialect=dialect)
        assert (verdict.read, verdict.code) == (False, "too_deep"), (form, verdict)
        assert f"nested more than {MAX_NESTING} levels deep" in verdict.reason
    # At the bound a statement is parsed and judged, from a caller's deep stack too.
    at_bound = "SELECT " + "(" * MAX_NESTING + "1" + ")" * MAX_NESTING
    assert _deep_call(200, lambda: judge(at_bound, dialect=dialect)).read
    calls = "SELECT " + "lower(" * MAX_NESTING + "'a'" + ")" * MAX_NESTING
    assert _deep_call(200, lambda: judge(calls, dialect=dialect)).read
    # A long flat statement under the bound (an operator chain 20,000 deep in the tree).
    assert judge("SELECT " + "1 + " * 20_000 + "1", dialect=dialect).code in ("read", "too_deep")
    assert time.perf_counter() - started < 30  # measured: about 1 s in all


def test_the_allow_lists_name_what_sqlglot_has_and_nothing_with_side_effects():
    """A renamed or removed sqlglot class would silently drop out of the lists: each name
    must be a class of the installed sqlglot, of the right kind. And none of the
    functions a read may call is one a database runs with effects beyond the statement."""
    for name in READ_NODES:
        cls = getattr(exp, name)
        assert issubclass(cls, exp.Expression) and not issubclass(cls, exp.Func), name
    for name in SYNTAX_FUNCTIONS:
        assert issubclass(getattr(exp, name), exp.Func), name
    assert "Anonymous" not in SYNTAX_FUNCTIONS
    effects = {
        "pg_read_file", "pg_read_binary_file", "pg_ls_dir", "pg_stat_file", "pg_sleep",
        "pg_terminate_backend", "pg_cancel_backend", "pg_reload_conf", "set_config",
        "current_setting", "pg_advisory_lock", "pg_try_advisory_lock", "pg_notify",
        "nextval", "setval", "lo_import", "lo_export", "dblink", "dblink_exec",
        "query_to_xml", "txid_current", "load_file", "sleep", "benchmark", "get_lock",
        "release_lock", "release_all_locks", "last_insert_id", "source_pos_wait",
        "master_pos_wait", "load_extension", "readfile", "writefile", "edit",
        "fts3_tokenizer", "randomblob", "zeroblob", "sys_exec", "sys_eval",
    }  # fmt: skip
    for dialect, names in FUNCTIONS.items():
        assert not names & effects, (dialect, names & effects)
        assert all(name == name.lower() and name.isidentifier() for name in names), dialect


def test_the_mysql_session_mode_drops_what_changes_lexing_only():
    assert mysql_sql_mode("ANSI_QUOTES,STRICT_TRANS_TABLES,NO_BACKSLASH_ESCAPES") == (
        "STRICT_TRANS_TABLES"
    )
    assert mysql_sql_mode("REAL_AS_FLOAT,PIPES_AS_CONCAT,ANSI_QUOTES,IGNORE_SPACE,ANSI") == (
        "REAL_AS_FLOAT,PIPES_AS_CONCAT,IGNORE_SPACE"
    )
    # Combination modes set ANSI_QUOTES again when named: dropped too.
    for combination in ("ORACLE", "POSTGRESQL", "MSSQL", "DB2", "MAXDB"):
        assert mysql_sql_mode(f"PIPES_AS_CONCAT,{combination},STRICT_ALL_TABLES") == (
            "PIPES_AS_CONCAT,STRICT_ALL_TABLES"
        )
    assert mysql_sql_mode("") == ""
    assert mysql_mode_lexes_as_parsed("STRICT_TRANS_TABLES,PIPES_AS_CONCAT")
    assert not mysql_mode_lexes_as_parsed("STRICT_TRANS_TABLES,ANSI_QUOTES")
    assert not mysql_mode_lexes_as_parsed("no_backslash_escapes")


def test_every_unicode_space_and_invisible_character_is_refused_in_every_dialect():
    """The parser's tokenizer takes ``str.isspace`` characters for whitespace; PostgreSQL
    takes them for part of a name, MySQL for no comment's end (the adversarial pass's
    first finding). Every one of them, and every control or format character but the
    plain whitespace, makes a statement not a read; letters of any script do not."""
    spaces = [chr(c) for c in range(0x110000) if chr(c).isspace() and chr(c) not in " \t\n\r\f\v"]
    invisible = ["\x00", "\x1b", "\u200b", "\u200d", "\u2060", "\ufeff", "\u00ad", "\ue000"]
    assert len(spaces) >= 20
    for dialect in DIALECTS:
        for char in spaces + invisible:
            verdict = judge(f"SELECT 1{char}", dialect=dialect)
            assert verdict.code == "unusual_character", (dialect, hex(ord(char)))
            assert f"U+{ord(char):04X}" in verdict.reason
        assert judge("SELECT 'ünïcødé ☕', 1 AS \"東京\"", dialect=dialect).read


def test_importing_the_rule_loads_neither_the_parser_nor_anything_of_paw():
    """paw-agent imports it at start: the parser (about 0.17 s) loads on the first
    statement judged, and the module pulls in nothing of PAW's server or of paw-agent."""
    probe = (
        "import sys; before = set(sys.modules); import paw_sqlcheck; "
        "print(' '.join(sorted(set(sys.modules) - before)))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout.split()
    assert "paw_sqlcheck" in loaded
    assert not [m for m in loaded if m.split(".")[0] in ("sqlglot", "paw_agent", "django")], loaded
