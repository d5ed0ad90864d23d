"""paw-sqlcheck: whether a SQL statement is a *read*, decided by a SQL parser.

One rule, used wherever PAW judges a statement: paw-agent's ``run_sql`` (a statement
that is not a read needs a person's approval on a writable datasource and is refused on
a read-only one) and the server's check of a knowledge example (only reads are saved).
Both install this distribution; it imports nothing of either.

A statement is a read when all of these hold (:func:`judge`):

1. It parses, for its dialect (PostgreSQL, MySQL / MariaDB or SQLite), with sqlglot: its
   comments and every literal form of the dialect (``E'…'``, dollar quoting, MySQL's
   backslash escapes, ``X'…'``, identifiers in ``"…"``, backquotes or brackets) are the
   parser's business, not a pattern's. What the parser cannot parse, or parses only as
   an opaque command, is not a read.
2. It is exactly one statement, a query: ``SELECT``, ``WITH … SELECT``, a set operation
   (``UNION`` …), ``VALUES``, ``TABLE t`` — or ``EXPLAIN`` (with any of its options,
   ``ANALYZE`` too) of such a query.
3. Every node of its tree is of a kind a read holds (:data:`allowlist.READ_NODES`): no
   data-modifying statement anywhere (DML in a CTE), no ``SELECT … INTO`` / ``INTO
   OUTFILE``, no locking clause (``FOR UPDATE``), no assignment, no user-defined operator.
4. It calls only functions on the allow-list of its dialect
   (:data:`allowlist.FUNCTIONS`: aggregates, window, string, math, date/time, JSON,
   arrays, conditionals, casts, harmless information functions), by their plain names:
   a quoted or schema-qualified function name is a user-defined function, never a read.
   Operators and functions with a grammar of their own (``CAST``, ``EXTRACT``, ``CASE``,
   ``->``) are allowed by kind (:data:`allowlist.SYNTAX_FUNCTIONS`).
5. On MySQL / MariaDB it holds no executable comment (``/*! … */``, ``/*M! … */``): the
   server runs what they hold, and a parser reads them as comments.

The database is the second wall (PAW refuses a read-only datasource whose user may do
more than read, and runs reads in a read-only transaction): this check decides what is
let through without asking, not what the database allows.
"""

from __future__ import annotations

import itertools
import logging
import re
from dataclasses import dataclass, replace
from typing import Any

from paw_sqlcheck.allowlist import (
    FUNCTIONS,
    READ_NODES,
    SECRET_TABLES,
    SYNTAX_FUNCTIONS,
    SYNTAX_REFUSED,
)

__all__ = [
    "DIALECTS", "MAX_NESTING", "MAX_SQL_BYTES", "MAX_SQL_CHARS", "POSTGRESQL_SESSION_OPTIONS",
    "SQLITE_MAX_LENGTH", "SessionMismatch", "Verdict", "is_read", "judge",
    "mysql_mode_lexes_as_parsed", "mysql_sql_mode", "sqlite_limit",
]  # fmt: skip

#: PAW's dialect names (and their aliases) → the dialect of the allow-lists.
DIALECTS = {
    "postgresql": "postgresql", "postgres": "postgresql", "mysql": "mysql",
    "mariadb": "mysql", "sqlite": "sqlite", "sqlite3": "sqlite",
}  # fmt: skip
#: sqlglot's name for each dialect.
_SQLGLOT = {"postgresql": "postgres", "mysql": "mysql", "sqlite": "sqlite"}
_LABELS = {"postgresql": "PostgreSQL", "mysql": "MySQL / MariaDB", "sqlite": "SQLite"}
#: Longer statements (in bytes of UTF-8) are not judged (not a read), before they are
#: tokenized: parsing time and memory stay bounded. ``MAX_SQL_CHARS`` is its older name.
MAX_SQL_BYTES = 100_000
MAX_SQL_CHARS = MAX_SQL_BYTES
#: Deepest nesting judged, counted on the tokens before parsing (:func:`_nesting`): each
#: open parenthesis, bracket or brace, each ``CASE``, each subscript of a chain
#: (``a[1][1]``) and each operator of a run of prefix operators (``NOT NOT``, ``- -``)
#: is one level. The parser recurses about 25 Python frames a level (and took quadratic
#: time on long subscript chains): deeper statements are not reads, and a
#: ``RecursionError`` of the parser is an answer (``too_deep``), never raised.
MAX_NESTING = 24
#: Words between ``EXPLAIN`` and the statement it explains (PostgreSQL's ``ANALYZE
#: VERBOSE``, MySQL's ``FORMAT=JSON`` / ``EXTENDED`` / ``PARTITIONS``, SQLite's ``QUERY
#: PLAN``); PostgreSQL's parenthesised option list is skipped whole.
_EXPLAIN_WORDS = frozenset(
    {"ANALYZE", "ANALYSE", "VERBOSE", "QUERY", "PLAN", "EXTENDED", "PARTITIONS", "FORMAT",
     "=", "TRADITIONAL", "JSON", "TREE"}
)  # fmt: skip
_EXPLAIN_KEYWORDS = frozenset({"EXPLAIN", "DESCRIBE", "DESC"})
_STATEMENTS = frozenset(
    {"Insert", "Update", "Delete", "Merge", "Copy", "Pragma", "Attach", "Detach", "Set",
     "Use", "Grant", "Revoke", "Analyze", "Describe", "Show", "Transaction", "Commit",
     "Rollback", "LoadData", "Kill", "Execute", "Declare"}
)  # fmt: skip
_QUERY_ROOTS = frozenset({"Select", "Union", "Intersect", "Except", "Subquery", "Values"})
#: Node kinds with a reason of their own when they make a statement not a read.
_WRITES = {
    "Into": "it writes its rows into a table, a variable or a file (SELECT … INTO)",
    "Lock": "it locks rows (FOR UPDATE / FOR SHARE / LOCK IN SHARE MODE)",
    "PropertyEQ": "it assigns a variable (:=)",
    "Operator": "it calls a user-defined operator (OPERATOR(…))",
    "Hint": "it carries optimizer hints, which may set variables",
}


#: libpq ``options`` that make a PostgreSQL session read string literals as the parser does:
#: a backslash in an ordinary ``'…'`` string is a plain character (the default since 9.1,
#: which a server's configuration may still turn off; with it off, ``'\\'`` would end
#: elsewhere than the parser thinks). Both sides add it to every connection they judge for.
POSTGRESQL_SESSION_OPTIONS = "-c standard_conforming_strings=on"
#: Bytes of the largest string or blob an SQLite connection that runs judged statements
#: may make (``SQLITE_LIMIT_LENGTH``; SQLite's default is 1,000,000,000): ``replace`` of
#: ``replace``, ``||`` in a recursive CTE or ``group_concat`` cannot build more than this
#: in one value ("string or blob too big"), nor can a stored value larger be read.
SQLITE_MAX_LENGTH = 32 * 1024 * 1024


def sqlite_limit(connection: Any) -> Any:
    """Set :data:`SQLITE_MAX_LENGTH` on an open ``sqlite3.Connection`` (Python 3.11+
    ``setlimit``) and return it. Both sides call it on every connection that runs a
    judged statement."""
    import sqlite3

    connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, SQLITE_MAX_LENGTH)
    return connection


#: ``sql_mode`` flags under which MySQL / MariaDB read a statement otherwise than the
#: parser: ``"…"`` as a name instead of a string (``ANSI_QUOTES``, part of ``ANSI``),
#: backslashes as plain characters (``NO_BACKSLASH_ESCAPES``).
MYSQL_LEXING_MODES = frozenset({"ANSI_QUOTES", "NO_BACKSLASH_ESCAPES"})
#: Combination modes that set ``ANSI_QUOTES`` again when named (MariaDB's manual, "SQL_MODE").
_MYSQL_COMBINATIONS = frozenset({"ANSI", "ORACLE", "POSTGRESQL", "MSSQL", "DB2", "MAXDB"})


def mysql_sql_mode(current: str) -> str:
    """The session's ``sql_mode`` (``@@SESSION.sql_mode``, comma-separated) without
    :data:`MYSQL_LEXING_MODES` and the combination modes that imply them (``ANSI``,
    ``ORACLE``, ``MSSQL``...), the rest kept in order: set it on a connection before a
    statement judged by this module runs (``SET SESSION sql_mode = %s``), then check
    what the server kept with :func:`mysql_mode_lexes_as_parsed`."""
    dropped = MYSQL_LEXING_MODES | _MYSQL_COMBINATIONS
    kept = [m for m in str(current or "").split(",") if m and m.upper() not in dropped]
    return ",".join(kept)


def mysql_mode_lexes_as_parsed(mode: str) -> bool:
    """Whether a session whose ``@@SESSION.sql_mode`` reads ``mode`` lexes statements as
    the parser does (none of :data:`MYSQL_LEXING_MODES` in it). A connection where this
    is false must not run a judged statement."""
    return not {m.strip().upper() for m in str(mode or "").split(",")} & MYSQL_LEXING_MODES


class SessionMismatch(RuntimeError):
    """A database session that does not lex statements as the parser does (PostgreSQL
    ``standard_conforming_strings`` off, MySQL ``ANSI_QUOTES`` or
    ``NO_BACKSLASH_ESCAPES`` still on after PAW set them): nothing judged may run there."""


class _QuietCommandFallback(logging.Filter):
    """sqlglot logs a warning each time it reads a statement as an opaque command
    (``SHOW``, ``CALL``, ``DO``…); for this check that is an ordinary answer (not a
    read), not something for the logs."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Falling back to parsing as a 'Command'" not in record.getMessage()


logging.getLogger("sqlglot").addFilter(_QuietCommandFallback())


@dataclass(frozen=True)
class Verdict:
    """What :func:`judge` found.

    ``read``: the statement is a read. ``code``: ``read``, or why not — ``empty``,
    ``several_statements``, ``unparsed``, ``not_a_query``, ``writes``, ``function``
    (a call outside the allow-list), ``qualified_function``, ``quoted_function``,
    ``unknown_node`` (a construct PAW does not know to be a read), ``field_of_expression``
    (``(x).f``), ``secret_table`` (``pg_authid``, ``mysql.user``...),
    ``function_of_row`` (``q.f`` of a function ``q`` in FROM without a column ``f``: the
    call ``f(q)``), ``executable_comment``, ``unusual_character``, ``too_long`` (over
    :data:`MAX_SQL_BYTES`), ``too_deep`` (over :data:`MAX_NESTING`), ``unknown_dialect``. ``reason``: one sentence
    for a person or the model (empty for a read). ``tables``: the tables and views it
    reads (``schema.table`` where qualified; CTE names left out), ``functions``: the
    functions it calls by name (lower-case), both sorted; filled for a read and for a
    statement refused by its tree. ``explain``: the read is an ``EXPLAIN`` (its rows are
    a plan, and PostgreSQL cannot read it through a cursor).
    """

    read: bool
    code: str
    reason: str = ""
    tables: tuple[str, ...] = ()
    functions: tuple[str, ...] = ()
    explain: bool = False


def is_read(sql: str, *, dialect: str) -> bool:
    """Whether ``sql`` is one read on ``dialect`` (see :func:`judge`)."""
    return judge(sql, dialect=dialect).read


def judge(sql: str, *, dialect: str) -> Verdict:
    """Judge ``sql`` for ``dialect`` (``postgresql``, ``mysql`` or ``sqlite``, or an alias
    in :data:`DIALECTS`) by the rules of the module docstring. Never raises: anything
    that cannot be judged (a parser failure, a statement over :data:`MAX_SQL_BYTES`
    bytes or nested deeper than :data:`MAX_NESTING`, an unknown dialect) is a
    :class:`Verdict` that is not a read."""
    canonical = DIALECTS.get(str(dialect).strip().lower())
    if canonical is None:
        return Verdict(False, "unknown_dialect", f"PAW knows no SQL dialect {dialect!r}")
    if not isinstance(sql, str) or not sql.strip():
        return Verdict(False, "empty", "there is no statement")
    # A character is 1 to 4 bytes: the length in characters settles most statements
    # without encoding them (a lone surrogate is encoded as is, and refused below).
    if len(sql) > MAX_SQL_BYTES or len(sql.encode("utf-8", "surrogatepass")) > MAX_SQL_BYTES:
        return Verdict(
            False,
            "too_long",
            f"it is longer than {MAX_SQL_BYTES:,} bytes, more than PAW checks for a read",
        )
    odd = _unusual_character(sql)
    if odd is not None:
        return Verdict(
            False,
            "unusual_character",
            f"it holds the character {odd}, which the parser and the database may read "
            "differently (a space to one, part of a name to the other)",
        )
    if canonical == "mysql" and ("/*!" in sql or "/*m!" in sql.lower()):
        return Verdict(
            False,
            "executable_comment",
            "it holds an executable comment (/*! … */), whose text MySQL and MariaDB run",
        )
    try:
        return _judge(sql, canonical, explain=True)
    except RecursionError:  # a tree deeper than the bound foresaw (a long operator chain)
        return _TOO_DEEP
    except Exception as exc:  # a failure of the parser's or of this module: not a read
        return Verdict(False, "unparsed", f"it cannot be judged: {_first_line(exc)}")


#: The only whitespace and control characters a judged statement may hold.
_PLAIN_WHITESPACE = frozenset(" \t\n\r\f\v")
#: Unicode categories a judged statement may not hold (outside :data:`_PLAIN_WHITESPACE`):
#: other spaces and separators (U+00A0, U+2028…: whitespace to the parser's tokenizer,
#: ``str.isspace``, but part of a name to PostgreSQL, and not a comment's end to MySQL),
#: control and format characters (NUL, U+0085, U+200B, U+FEFF), surrogates, private use
#: and unassigned code points.
_UNUSUAL_CATEGORIES = frozenset({"Zs", "Zl", "Zp", "Cc", "Cf", "Cs", "Co", "Cn"})


def _unusual_character(sql: str) -> str | None:
    """The first character of ``sql`` that the parser and a database may lex apart
    (``U+00A0 (NO-BREAK SPACE)``), or None."""
    import unicodedata

    for char in sql:
        if char.isascii() and (char.isprintable() or char in _PLAIN_WHITESPACE):
            continue
        if char in _PLAIN_WHITESPACE:
            continue
        if unicodedata.category(char) in _UNUSUAL_CATEGORIES or char.isspace():
            name = unicodedata.name(char, "unnamed")
            return f"U+{ord(char):04X} ({name})"
    return None


_TOO_DEEP = Verdict(
    False,
    "too_deep",
    f"it is nested more than {MAX_NESTING} levels deep (parentheses, brackets, CASE, "
    "subscripts or prefix operators), more than PAW checks for a read",
)
_OPENERS = ("L_PAREN", "L_BRACKET", "L_BRACE", "CASE")
_CLOSERS = ("R_PAREN", "R_BRACKET", "R_BRACE", "END")
_PREFIX_OPERATORS = ("NOT", "DASH", "PLUS", "TILDE", "EXCLAMATION")


def _nesting(tokens: list[Any]) -> int:
    """How deep ``tokens`` nest, by :data:`MAX_NESTING`'s count: one level per open
    parenthesis, bracket, brace or ``CASE`` not yet closed, one per subscript of a chain
    (``a[1][1]``: each ``]`` followed by ``[``) and one per operator of a run of operators
    that may be prefix ones (``NOT NOT x``, ``- - 1``). Linear time."""
    from sqlglot.tokens import TokenType

    openers = {getattr(TokenType, name) for name in _OPENERS}
    closers = {getattr(TokenType, name) for name in _CLOSERS}
    prefix = {getattr(TokenType, name) for name in _PREFIX_OPERATORS}
    depth = deepest = run = chain = 0
    previous = None
    for token in tokens:
        kind = token.token_type
        run = run + 1 if kind in prefix else 0
        if kind == TokenType.L_BRACKET and previous == TokenType.R_BRACKET:
            chain += 1
        elif previous == TokenType.R_BRACKET:
            chain = 0
        if kind in openers:
            depth += 1
        elif kind in closers:
            depth -= 1
        deepest = max(deepest, depth + run + chain)
        previous = kind
    return deepest


def _a(word: str) -> str:
    """``word`` with its indefinite article (``an UPDATE``, ``a DELETE``)."""
    return f"{'an' if word[:1] in 'AEIOU' else 'a'} {word}"


def _tokens(sql: str, dialect: str) -> list[Any]:
    from sqlglot.dialects.dialect import Dialect

    return Dialect.get_or_raise(_SQLGLOT[dialect]).tokenize(sql)


def _first_line(error: Exception) -> str:
    """The parser's message, one line, without the terminal colours sqlglot adds."""
    errors = getattr(error, "errors", None)
    if errors and isinstance(errors[0], dict) and errors[0].get("description"):
        first = errors[0]
        text = f"{first['description']} (line {first.get('line')}, column {first.get('col')})"
    else:
        text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    text = " ".join(text.split())
    return text[:200] + ("…" if len(text) > 200 else "")


def _judge(sql: str, dialect: str, *, explain: bool) -> Verdict:
    import sqlglot

    try:
        tokens = _tokens(sql, dialect)
    except Exception as exc:  # sqlglot's TokenError, or any failure: not judged, not a read
        return Verdict(False, "unparsed", f"it cannot be parsed: {_first_line(exc)}")
    if not tokens:
        return Verdict(False, "empty", "there is no statement (only comments)")
    from sqlglot.tokens import TokenType

    statements = 1
    for before, token in itertools.pairwise(tokens):
        if before.token_type == TokenType.SEMICOLON and token.token_type != TokenType.SEMICOLON:
            statements += 1
    if statements > 1:
        return Verdict(
            False, "several_statements", "it is several statements; a read is exactly one"
        )
    if _nesting(tokens) > MAX_NESTING:
        return _TOO_DEEP
    if explain and tokens[0].text.upper() in _EXPLAIN_KEYWORDS:
        return _explained(sql, tokens[0], dialect)
    problem = _parser_function_names(tokens, sql, dialect)
    if problem is not None:
        return Verdict(False, *problem)
    try:
        parsed = sqlglot.parse(sql, read=_SQLGLOT[dialect])
    except RecursionError:
        return _TOO_DEEP
    except Exception as exc:  # ParseError, or any failure of the parser
        return Verdict(False, "unparsed", f"it cannot be parsed: {_first_line(exc)}")
    from sqlglot import exp

    roots = [node for node in parsed if node is not None and not isinstance(node, exp.Semicolon)]
    if len(roots) != 1:
        return Verdict(
            False, "several_statements", "it is several statements; a read is exactly one"
        )
    root = roots[0]
    if type(root).__name__ not in _QUERY_ROOTS:
        # The statement's own name where the parser knows it as a statement (a WITH that
        # ends in a DELETE is a DELETE), else its first word (LISTEN, VACUUM…).
        kind = tokens[0].text.upper()
        if isinstance(root, exp.Command):
            kind = str(root.this).upper()
        elif isinstance(root, exp.DML | exp.DDL) or type(root).__name__ in _STATEMENTS:
            kind = root.key.upper()
        return Verdict(
            False,
            "not_a_query",
            f"it is {_a(kind)} statement; a read is one SELECT, WITH or EXPLAIN",
        )
    return _tree_verdict(root, sql, dialect)


def _explained(sql: str, keyword: Any, dialect: str) -> Verdict:
    """``EXPLAIN [options] <statement>``: a read when the statement is (``EXPLAIN
    ANALYZE`` runs it, so it must be)."""
    from sqlglot.tokens import TokenType

    rest = sql[keyword.end + 1 :]
    try:
        tokens = _tokens(rest, dialect)
    except Exception as exc:
        return Verdict(False, "unparsed", f"it cannot be parsed: {_first_line(exc)}")
    index = 0
    if tokens and tokens[0].token_type == TokenType.L_PAREN:
        index = 1
        while index < len(tokens) and tokens[index].token_type != TokenType.R_PAREN:
            if tokens[index].token_type == TokenType.L_PAREN:
                return Verdict(False, "unparsed", "its EXPLAIN options cannot be read")
            index += 1
        index += 1
    while index < len(tokens) and tokens[index].text.upper() in _EXPLAIN_WORDS:
        index += 1
    if index >= len(tokens):
        return Verdict(False, "not_a_query", "it is an EXPLAIN of no statement")
    verdict = _judge(rest[tokens[index].start :], dialect, explain=False)
    if verdict.read:
        return replace(verdict, explain=True)
    if verdict.code != "not_a_query":
        return verdict
    return Verdict(False, "not_a_query", f"it explains what is not a read: {verdict.reason}")


def _tree_verdict(root: Any, sql: str, dialect: str) -> Verdict:
    from sqlglot import exp

    functions: set[str] = set()
    ctes = {cte.alias_or_name.lower() for cte in root.find_all(exp.CTE)}
    tables: set[str] = set()

    def refused(code: str, reason: str) -> Verdict:
        return Verdict(False, code, reason, tuple(sorted(tables)), tuple(sorted(functions)))

    rows = _function_items(root, sql) if dialect == "postgresql" else {}
    for node in root.walk():
        kind = type(node).__name__
        if rows and isinstance(node, exp.Column) and node.table and not node.args.get("db"):
            columns = rows.get(_folded(node.args["table"]))
            name = node.this
            if (
                columns is not None
                and isinstance(name, exp.Identifier)
                and (_folded(name) not in columns)
            ):
                return refused(
                    "function_of_row",
                    f"it names {node.sql(dialect='postgres')[:80]}, and {node.table} "
                    f"(a function in FROM) has no column {name.name}: PostgreSQL reads "
                    f"that as the call {name.name}({node.table})",
                )
        if (
            isinstance(node, exp.Table)
            and isinstance(node.this, exp.Func)
            and (node.args.get("db") or node.args.get("catalog"))
        ):
            return refused(
                "qualified_function",
                f"it calls {node.this.sql(dialect=_SQLGLOT[dialect])[:60]} in FROM by a "
                "schema-qualified name; a read calls functions by their plain names only",
            )
        if isinstance(node, exp.Func):
            problem = _function_problem(node, sql, dialect, functions)
            if problem is not None:
                return refused(*problem)
            continue
        if kind not in READ_NODES:
            if kind in _WRITES:
                return refused("writes", _WRITES[kind])
            if isinstance(node, exp.DML | exp.DDL) or kind in ("Insert", "Update", "Delete"):
                return refused(
                    "writes", f"it holds {_a(node.key.upper())} statement, which changes data"
                )
            return refused(
                "unknown_node",
                f"it uses {node.key.upper()}, which PAW does not know to be a read",
            )
        if isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
            return refused(
                "qualified_function",
                f"it calls {node.sql(dialect=_SQLGLOT[dialect])[:80]} by a schema-qualified "
                "name; a read calls functions by their plain names only",
            )
        if isinstance(node, exp.Dot) and not _plain_name_part(node):
            # PostgreSQL reads (expr).f as f(expr): a call of any one-argument function.
            return refused(
                "field_of_expression",
                f"it selects a field of an expression ({node.sql(dialect=_SQLGLOT[dialect])[:60]}), "
                "which PostgreSQL reads as a call of the function of that name",
            )
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            name = ".".join(part.name for part in node.parts)
            secret = _secret_table(node, dialect)
            if secret:
                return refused(
                    "secret_table",
                    f"it reads {secret}, where the server keeps passwords or large objects; "
                    "a read never names it",
                )
            if name.lower() not in ctes:
                tables.add(name)
    return Verdict(True, "read", "", tuple(sorted(tables)), tuple(sorted(functions)))


#: The columns of PostgreSQL's set-returning functions that return rows of their own (OUT
#: parameters) rather than one value, when used in FROM without a column list.
_FUNCTION_COLUMNS = {
    "json_each": ("key", "value"), "jsonb_each": ("key", "value"),
    "json_each_text": ("key", "value"), "jsonb_each_text": ("key", "value"),
    "json_array_elements": ("value",), "jsonb_array_elements": ("value",),
    "json_array_elements_text": ("value",), "jsonb_array_elements_text": ("value",),
}  # fmt: skip


def _folded(identifier: Any) -> str:
    """A name as PostgreSQL looks it up: a quoted one as written, a plain one in lower case."""
    if getattr(identifier, "quoted", False):
        return str(identifier.name)
    return str(getattr(identifier, "name", identifier)).lower()


def _function_items(root: Any, sql: str) -> dict[str, frozenset[str]]:
    """PostgreSQL's FROM items that are function calls (``FROM concat('x') AS q``,
    ``LATERAL f(…) AS q``, ``ROWS FROM (…)``): the name each answers to → the columns it
    has. A function returning one value gives one column, named after the item's alias
    (or the function); one returning rows, the columns of :data:`_FUNCTION_COLUMNS`; an
    item's column list (``AS q(a, b)``, ``WITH ORDINALITY``) wins. Anything else —
    ``q.f`` for a name ``f`` that is no column of ``q`` — PostgreSQL reads as the call
    ``f(q)``, with the value the function returned: any one-argument function."""
    from sqlglot import exp

    items: dict[str, frozenset[str]] = {}
    for node in root.find_all(exp.Table, exp.Lateral):
        function = node.this
        rows_from = node.args.get("rows_from") if isinstance(node, exp.Table) else None
        if not isinstance(function, exp.Func) and not rows_from:
            continue
        meta = function.meta if isinstance(function, exp.Func) else {}
        if meta and "start" in meta and "end" in meta:
            called = sql[meta["start"] : meta["end"] + 1].lower()
        elif isinstance(function, exp.Anonymous):
            called = str(function.name).lower()
        else:
            called = ""
        alias = node.args.get("alias")
        name = _folded(alias.this) if alias is not None and alias.this else called
        listed = [
            _folded(column.this if isinstance(column, exp.ColumnDef) else column)
            for column in (alias.columns if alias is not None else [])
        ]
        if listed:
            columns = set(listed)
        elif rows_from:
            columns = set()  # several functions: their columns are listed or unknown
        elif called in _FUNCTION_COLUMNS:
            columns = set(_FUNCTION_COLUMNS[called])
        else:
            columns = {name}
        if node.args.get("ordinality") and not listed:
            columns.add("ordinality")
        if name:
            # The same name twice (in two subqueries): only what both have.
            items[name] = frozenset(columns) & items.get(name, frozenset(columns))
    return items


def _secret_table(node: Any, dialect: str) -> str:
    """The name of :data:`allowlist.SECRET_TABLES` that a ``Table`` node names, or ``""``:
    on PostgreSQL its own name in any schema, on MySQL ``database.table``."""
    parts = [str(part.name).lower() for part in node.parts]
    secrets = SECRET_TABLES[dialect]
    if dialect == "postgresql":
        return parts[-1] if parts[-1] in secrets else ""
    qualified = ".".join(parts[-2:])
    return qualified if qualified in secrets else ""


def _plain_name_part(node: Any) -> bool:
    """Whether a ``Dot`` node is one more part of a dotted name (``a.b.c.d.e``) or
    ``(x).*``, not a field taken of an expression."""
    from sqlglot import exp

    if isinstance(node.expression, exp.Star):
        return True
    return isinstance(node.expression, exp.Identifier) and isinstance(
        node.this, exp.Column | exp.Identifier | exp.Dot
    )


def _parser_function_names(tokens: list[Any], sql: str, dialect: str) -> tuple[str, str] | None:
    """Every name the parser knows as a function, followed by ``(``, checked here on the
    tokens against the dialect's list: the calls the parser reads with a grammar of their
    own (``CAST(``, ``MAX_BY(``, ``INITCAP(``...: its ``FUNCTION_PARSERS``) and some it
    maps by name (``IF(``, ``VAR_MAP(``, ``TS_OR_DS_TO_DATE_STR(``...) carry no position
    in the tree, and become nodes judged by kind (``If``, ``Array``, ``Cast``): a
    database without that function built in runs a user-defined one of that name. On
    MySQL every such call's name must touch its parenthesis: ``count (x)`` calls a stored
    function named ``count``. A quoted name is left to the tree (``quoted_function``)."""
    from sqlglot.dialects.dialect import Dialect
    from sqlglot.tokens import TokenType

    parser = Dialect.get_or_raise(_SQLGLOT[dialect]).parser_class
    special = parser.FUNCTION_PARSERS
    known = _parser_names(dialect)
    callable_tokens = parser.FUNC_TOKENS
    # After a value or AS, a name and "(" are an operator's (x LIKE (…)), a type's
    # (CAST(x AS DECIMAL(10, 2))) or an alias's column list: never a call.
    no_call_after = {
        TokenType.VAR, TokenType.IDENTIFIER, TokenType.NUMBER, TokenType.STRING,
        TokenType.R_PAREN, TokenType.R_BRACKET, TokenType.NULL, TokenType.TRUE,
        TokenType.FALSE, TokenType.STAR, TokenType.ALIAS,
    }  # fmt: skip
    previous = None
    for name, after in itertools.pairwise(tokens):
        before, previous = previous, name.token_type
        if after.token_type != TokenType.L_PAREN or name.token_type in (
            TokenType.STRING,
            TokenType.IDENTIFIER,
        ):
            continue
        word = name.text.upper()
        if word == "VALUES":  # a VALUES list, or MySQL's VALUES(col) of an upsert: no call
            continue
        if (
            word in known
            and name.token_type in callable_tokens
            and before not in no_call_after
            and word.lower() not in FUNCTIONS[dialect]
        ):
            return (
                "function",
                f"it calls {word.lower()}(), which is not on the list of functions a read may "
                f"call on {_LABELS[dialect]}",
            )
        if dialect == "mysql" and word in special and name.end + 1 != after.start:
            return (
                "function",
                f"it puts a space between {word.lower()} and its parenthesis, which on MySQL "
                "may call a stored function of that name",
            )
    return None


#: Words followed by ``(`` that are syntax, not calls, though the parser also knows a
#: function of that name (``EXISTS (SELECT …)``, ``ARRAY(SELECT …)``, ``ANY (…)``...).
_NOT_CALLS = frozenset(
    {"EXISTS", "ARRAY", "ANY", "ALL", "SOME", "ROW", "IN", "OVER", "FILTER", "USING",
     "ROLLUP", "CUBE", "GROUPING", "LATERAL", "UNNEST", "STRUCT", "MAP", "TUPLE"}
)  # fmt: skip
_NAMES_CACHE: dict[str, frozenset[str]] = {}


def _parser_names(dialect: str) -> frozenset[str]:
    """The upper-case names the parser of ``dialect`` maps to a function (its
    ``FUNCTIONS`` and ``FUNCTION_PARSERS``), but for :data:`_NOT_CALLS`."""
    names = _NAMES_CACHE.get(dialect)
    if names is None:
        from sqlglot.dialects.dialect import Dialect

        parser = Dialect.get_or_raise(_SQLGLOT[dialect]).parser_class
        names = frozenset(set(parser.FUNCTIONS) | set(parser.FUNCTION_PARSERS)) - _NOT_CALLS
        _NAMES_CACHE[dialect] = names
    return names


#: A function name that may be on an allow-list: ASCII letters, digits and ``_``.
_PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _function_problem(
    node: Any, sql: str, dialect: str, functions: set[str]
) -> tuple[str, str] | None:
    """Why a function node makes the statement not a read (``(code, reason)``), or None.
    A node the parser made from ``name(`` carries the name's position (its ``meta``): that
    name, as the database will look it up, must be on the dialect's list. A node without
    one comes from syntax (an operator, ``CAST``, ``CASE``…) and is judged by its kind."""
    from sqlglot import exp

    meta = node.meta or {}
    if type(node).__name__ in SYNTAX_REFUSED[dialect]:
        return (
            "function",
            "it matches a regular expression (REGEXP / RLIKE), whose backtracking on "
            f"{_LABELS[dialect]} may spend the server's CPU for seconds on every row",
        )
    if "start" in meta and "end" in meta:
        text = sql[meta["start"] : meta["end"] + 1]
    elif isinstance(node, exp.Anonymous):
        text = str(node.name)
    elif type(node).__name__ in SYNTAX_FUNCTIONS:
        return None
    else:
        return (
            "unknown_node",
            f"it uses {node.key.upper()}, which PAW does not know to be a read",
        )
    if text[:1] in ('"', "`", "["):
        return (
            "quoted_function",
            f"it calls {text}() by a quoted name, which names a user-defined function",
        )
    if not _PLAIN_NAME.fullmatch(text):
        # Only ASCII names are on the lists: "ranK" (U+212A KELVIN SIGN) is "rank" in
        # Python's lower case, and a name of its own to PostgreSQL (which folds ASCII only).
        return (
            "function",
            f"it calls {text}(), whose name is not a plain ASCII name; only those are on the "
            f"list of functions a read may call on {_LABELS[dialect]}",
        )
    name = text.lower()
    functions.add(name)
    if dialect == "mysql" and "end" in meta and sql[meta["end"] + 1 : meta["end"] + 2] != "(":
        return (
            "function",
            f"it puts a space or a comment between {name} and its parenthesis, which on MySQL "
            "may call a stored function of that name",
        )
    if name not in FUNCTIONS[dialect]:
        return (
            "function",
            f"it calls {name}(), which is not on the list of functions a read may call on "
            f"{_LABELS[dialect]} (a function outside it may change data or reach the server)",
        )
    return None
