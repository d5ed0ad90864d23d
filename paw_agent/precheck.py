"""``run_sql``'s check of a statement before it runs (issue 28, part 4).

Two steps, both before anything of the statement itself is sent:

1. **Parsed** for the datasource's dialect, by the judge of a read (``paw_sqlcheck``,
   sqlglot): a statement the parser cannot parse (``Verdict.code == "unparsed"``) is sent
   back to the model with the parser's message, pointing at where it stopped.
2. **Planned** by the database: a statement judged a *read* (and not itself an
   ``EXPLAIN``) is sent once as ``EXPLAIN`` — PostgreSQL ``EXPLAIN (ANALYZE FALSE) …``,
   MySQL / MariaDB ``EXPLAIN …``, SQLite ``EXPLAIN QUERY PLAN …`` — through
   :func:`paw_agent.sql.run_query` with every guard rail of a read: a read-only
   transaction (SQLite ``mode=ro``), the session checks, a short statement timeout
   (:data:`CHECK_TIMEOUT`), and the run's cancel. ``EXPLAIN`` plans without executing
   (never ``ANALYZE``: PostgreSQL's option list says ``ANALYZE FALSE`` outright, so
   nothing after it can turn it on); the ``EXPLAIN`` text is judged a read again before it
   is sent. A database that refuses to plan it (an unknown column or table, a syntax error
   the parser let through, an ambiguous name, a bad cast of a constant) refuses the
   statement: it is sent back with the database's message.

A check that cannot decide lets the statement run as before: the ``EXPLAIN`` took longer
than its timeout (``timeout``). A connection that cannot be made or a session PAW cannot
judge for is the statement's own outcome (:class:`~paw_agent.sql.SqlError`, raised), as it
would have been without the check. Statements that are not reads are not ``EXPLAIN``ed:
they wait for a person's approval and run as approved.

MariaDB's optimizer may evaluate a constant subquery while planning (``WHERE x =
(SELECT max(…) …)``): a read, inside the same read-only transaction and limits as the
statement it checks.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from paw_agent.control import RunControl
from paw_agent.sql import Datasource, SqlError, run_query

#: Seconds an ``EXPLAIN`` may take (at most the tool's own time limit).
CHECK_TIMEOUT = 5.0
#: What each dialect's plan is asked with; the statement follows.
EXPLAIN_PREFIX = {
    "postgresql": "EXPLAIN (ANALYZE FALSE) ",
    "mysql": "EXPLAIN ",
    "sqlite": "EXPLAIN QUERY PLAN ",
}
#: Characters of a name shown in a check's one-line message.
NAME_CHARS = 80


@dataclass(frozen=True)
class Check:
    """What the check of one statement found.

    ``outcome``: ``planned`` (the database planned it: it runs), ``refused`` (it does not
    parse or does not plan: it is not run), ``timeout`` (the ``EXPLAIN`` took longer
    than its limit: it runs unchecked) or ``skipped`` (the run's ``--sql-retries`` are
    used: it runs unchecked; code ``retries_used``). ``code``: ``planned``, ``timeout``,
    ``unparsed`` (the parser's refusal), or the database's reason: ``unknown_column``,
    ``unknown_table``, ``unknown_function``, ``ambiguous_column``, ``missing_from`` (a
    name ``q.x`` whose ``q`` is no table or alias of its ``FROM``), ``syntax_error``,
    ``not_planned`` (any other). ``message``: one line for people (``unknown column
    p.price``); ``name``: the name it is about (``p.price``), or ``""``; ``detail``: the
    database's or the parser's whole message, for the model. ``explained``: an
    ``EXPLAIN`` was sent to the database; ``duration_ms``: how long it took
    (milliseconds), None when none was sent."""

    outcome: str
    code: str
    message: str
    name: str = ""
    detail: str = ""
    explained: bool = False
    duration_ms: int | None = None

    @property
    def refused(self) -> bool:
        """The statement is sent back to the model, not run."""
        return self.outcome == "refused"

    def data(self) -> dict[str, Any]:
        """The check for the host (``notify tool`` ``sql_check``): ``{"ok": true | false |
        null (undecided), "outcome", "code", "message", "name", "explained",
        "duration_ms"}``."""
        ok = {"planned": True, "refused": False}.get(self.outcome)
        return {
            "ok": ok,
            "outcome": self.outcome,
            "code": self.code,
            "message": self.message,
            "name": self.name,
            "explained": self.explained,
            "duration_ms": self.duration_ms,
        }


def explain_statement(sql: str, dialect: str) -> str | None:
    """The ``EXPLAIN`` that plans ``sql`` (a read of ``dialect``) without running it, or
    None when there is none to send: an unknown dialect, or a text that is not one read
    once prefixed (``paw_sqlcheck.judge``; a defence in depth: a read is one query, so it
    starts with ``SELECT``, ``WITH``, ``VALUES``, ``TABLE`` or a parenthesis, never with a
    word ``EXPLAIN`` would take as an option such as MySQL's ``ANALYZE``, and PostgreSQL's
    prefix closes its option list itself)."""
    from paw_sqlcheck import judge

    prefix = EXPLAIN_PREFIX.get(dialect)
    if prefix is None:
        return None
    text = prefix + sql.strip()
    verdict = judge(text, dialect=dialect)
    return text if verdict.read and verdict.explain else None


def parse_refusal(sql: str, reason: str) -> Check:
    """The check of a statement the parser refused (``reason``: the ``Verdict``'s, e.g.
    ``it cannot be parsed: Invalid expression / Unexpected token (line 1, column 23)``):
    refused, with a pointer at the place named (the line, and a ``^`` under its end)."""
    detail = reason.removeprefix("it cannot be parsed: ")
    place = re.search(r"\(line (\d+), column (\d+)\)", detail)
    near = ""
    pointer = ""
    if place:
        number, column = int(place.group(1)), int(place.group(2))
        lines = sql.splitlines() or [""]
        if 1 <= number <= len(lines):
            line = lines[number - 1]
            column = max(1, min(column, len(line)))
            word = re.search(r"(\S+)\s*$", line[:column])
            near = word.group(1)[-NAME_CHARS:] if word else ""
            pointer = f"\n{line}\n{' ' * (column - 1)}^"
    message = f"does not parse near {near}" if near else "does not parse"
    return Check(
        outcome="refused",
        code="unparsed",
        message=message,
        name=near,
        detail=f"the statement does not parse: {detail}{pointer}",
    )


def explain_check(
    source: Datasource, sql: str, *, timeout: float, control: RunControl
) -> Check | None:
    """``EXPLAIN`` the read ``sql`` on ``source`` within ``timeout`` seconds (a read-only
    transaction, the run's cancel): ``planned``, ``refused`` (the database's reason:
    :func:`problem_of`) or ``timeout``. None when there is no ``EXPLAIN`` to send
    (:func:`explain_statement`). Raises :class:`~paw_agent.sql.SqlError` for what would
    have stopped the statement too (``connect_failed``, ``session_mismatch``) and
    ``Stopped`` when the run is stopped meanwhile (the ``EXPLAIN`` is cancelled)."""
    text = explain_statement(sql, source.dialect)
    if text is None:
        return None
    began = time.monotonic()
    try:
        run_query(source, text, read_only=True, timeout=timeout, control=control, explain=True)
    except SqlError as exc:
        took = _ms(began)
        if exc.code == "interrupted":
            control.check()  # the run was stopped: Stopped, as for the statement itself
        if exc.code == "timeout":
            return Check(
                outcome="timeout",
                code="timeout",
                message=f"not checked: planning took longer than {timeout:g} s",
                explained=True,
                duration_ms=took,
            )
        if exc.code != "database_error":
            raise
        detail = _without_prefix(str(exc), text, sql)
        code, name, message = problem_of(detail)
        return Check(
            outcome="refused",
            code=code,
            message=message,
            name=name,
            detail=detail,
            explained=True,
            duration_ms=took,
        )
    return Check(
        outcome="planned", code="planned", message="planned", explained=True, duration_ms=_ms(began)
    )


def _ms(began: float) -> int:
    return max(0, round((time.monotonic() - began) * 1000))


def _without_prefix(message: str, text: str, sql: str) -> str:
    """PostgreSQL quotes the statement's line with a ``^`` under the error (``LINE 1:
    EXPLAIN (ANALYZE FALSE) SELECT …``): show the model its own statement there, the
    ``^`` moved with it."""
    prefix = text[: len(text) - len(sql.strip())]
    own = (sql.strip().split("\n") or [""])[0]
    lines = message.split("\n")
    for index, line in enumerate(lines):
        head = "LINE 1: "
        if line.startswith(head + prefix):
            shown = line[len(head) + len(prefix) :]
            # Cut to fit with the prefix: the statement's own line, whole when short.
            if shown.endswith("...") and own.startswith(shown[:-3]) and len(own) <= 200:
                shown = own
            lines[index] = head + shown
            following = index + 1
            if following < len(lines) and lines[following].strip() == "^":
                caret = lines[following]
                lines[following] = " " * max(len(head), len(caret) - 1 - len(prefix)) + "^"
            break
    return "\n".join(lines)


#: The databases' words for why a statement does not plan: (pattern, code, message). A
#: pattern's group ``name`` is the name the message is about. PostgreSQL (its English
#: messages), SQLite, MySQL / MariaDB.
_PROBLEMS = (
    (r"column (?:reference )?\"?(?P<name>[^\"\s]+)\"? is ambiguous", "ambiguous_column"),
    (r"column \"?(?P<name>[^\"\s]+(?:\.[^\"\s]+)*)\"? does not exist", "unknown_column"),
    (r"relation \"(?P<name>[^\"]+)\" does not exist", "unknown_table"),
    (r"missing FROM-clause entry for table \"(?P<name>[^\"]+)\"", "missing_from"),
    (r"function (?P<name>[^\s(]+)\([^)]*\) does not exist", "unknown_function"),
    (r"syntax error at or near \"(?P<name>[^\"]*)\"", "syntax_error"),
    (r"syntax error at end of input", "syntax_error"),
    (r"no such column: (?P<name>\S+)", "unknown_column"),
    (r"no such table: (?P<name>\S+)", "unknown_table"),
    (r"no such function: (?P<name>\S+)", "unknown_function"),
    (r"ambiguous column name: (?P<name>\S+)", "ambiguous_column"),
    (r"near \"(?P<name>[^\"]*)\": syntax error", "syntax_error"),
    (r"incomplete input", "syntax_error"),
    (r"Unknown column '(?P<name>[^']+)'", "unknown_column"),
    (r"Table '(?:[^'.]+\.)?(?P<name>[^']+)' doesn't exist", "unknown_table"),
    (r"Unknown table '(?P<name>[^']+)'", "unknown_table"),
    (r"FUNCTION (?:[^\s.]+\.)?(?P<name>\S+) does not exist", "unknown_function"),
    (r"Column '(?P<name>[^']+)' in .* is ambiguous", "ambiguous_column"),
    (r"error in your SQL syntax.*? near '(?P<name>.*?)' at line \d+", "syntax_error"),
)
_WORDS = {
    "unknown_column": "unknown column",
    "unknown_table": "unknown table",
    "unknown_function": "unknown function",
    "ambiguous_column": "ambiguous column",
    "missing_from": "no FROM entry for",
    "syntax_error": "syntax error near",
}


def problem_of(message: str) -> tuple[str, str, str]:
    """``(code, name, one line)`` of a database's refusal to plan (``message`` as
    :class:`~paw_agent.sql.SqlError` words it: ``PostgreSQL error: column p.price does not
    exist``…): ``("unknown_column", "p.price", "unknown column p.price")``; anything
    unrecognised is ``not_planned`` with the message's first line (cut at 120
    characters)."""
    for pattern, code in _PROBLEMS:
        found = re.search(pattern, message, flags=re.DOTALL)
        if found is None:
            continue
        name = (found.groupdict().get("name") or "").strip()
        if code == "syntax_error" and not name:
            return code, "", "syntax error at the end of the statement"
        name = name.split("\n")[0][:NAME_CHARS]
        return code, name, f"{_WORDS[code]} {name}"
    first = message.split("\n", 1)[0]
    first = re.sub(r"^(PostgreSQL|SQLite|MySQL) error: ", "", first)
    return "not_planned", "", first if len(first) <= 120 else first[:119] + "…"
