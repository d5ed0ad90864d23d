"""Hypothesis strategies for the rule of a read: statements that hide writes and
side-effect calls among comments and literals of every form a dialect has, and reads that
hide the *text* of such calls in their comments and literals.

Everything drawn is meant to be valid SQL of its dialect (the tests check that on the real
database, and Hypothesis's health check fails when too much is not), so that a statement
is refused for what it does, not because it does not parse.
"""

from __future__ import annotations

from hypothesis import strategies as st

DIALECTS = ("postgresql", "mysql", "sqlite")

#: Characters of a comment's or a string's content: quotes, backslashes, comment and
#: statement delimiters, dollar signs, newlines.
_TRICKY = "ab'\"\\;-/*#$() \n"
_content = st.text(alphabet=_TRICKY, max_size=12)

#: Calls with effects beyond the statement, per dialect (name, arguments): each exists on
#: the test servers, so a statement calling one prepares there.
EFFECTS = {
    "postgresql": [
        ("pg_read_file", ["'/etc/hostname'"]),
        ("pg_terminate_backend", ["0"]),
        ("set_config", ["'paw.probe'", "'hit'", "false"]),
        ("pg_advisory_lock", ["42"]),
        ("pg_notify", ["'paw'", "'x'"]),
        ("lo_import", ["'/etc/hostname'"]),
        ("pg_sleep", ["0"]),
        ("pg_cancel_backend", ["0"]),
        ("pg_ls_dir", ["'.'"]),
    ],
    "mysql": [
        ("load_file", ["'/etc/hostname'"]),
        ("sleep", ["0"]),
        ("get_lock", ["'paw'", "0"]),
        ("release_lock", ["'paw'"]),
        ("benchmark", ["1", "1"]),
        ("last_insert_id", ["5"]),
    ],
    "sqlite": [
        ("load_extension", ["'x'"]),
        ("randomblob", ["8"]),
        ("zeroblob", ["8"]),
    ],
}
#: Writes, per dialect, on the test table ``paw_probe (a int)``.
WRITES = {
    "postgresql": [
        "DELETE FROM paw_probe", "UPDATE paw_probe SET a = 1", "INSERT INTO paw_probe VALUES (1)",
    ],
    "mysql": [
        "DELETE FROM paw_probe", "UPDATE paw_probe SET a = 1", "INSERT INTO paw_probe VALUES (1)",
    ],
    "sqlite": [
        "DELETE FROM paw_probe", "UPDATE paw_probe SET a = 1", "INSERT INTO paw_probe VALUES (1)",
    ],
}  # fmt: skip


@st.composite
def noise(draw, dialect: str) -> str:
    """Whitespace or a comment, as the dialect writes them."""
    kinds = ["space", "block", "line"]
    if dialect == "mysql":
        kinds.append("hash")
    if dialect == "postgresql":
        kinds.append("nested")
    kind = draw(st.sampled_from(kinds))
    if kind == "space":
        return draw(st.sampled_from([" ", "\t", "\n", "  \n "]))
    text = draw(_content)
    if kind == "block":
        # Not closed early, not nested (only PostgreSQL nests), not MySQL's executable form.
        body = text.replace("*/", "* /").replace("/*", "/ *").lstrip("!M")
        return f" /*{body}*/ "
    if kind == "nested":
        inner = text.replace("*/", "").replace("/*", "")
        return f" /* {inner} /* {inner} */ {inner} */ "
    line = text.replace("\n", " ")
    return f" -- {line}\n" if kind == "line" else f" #{line}\n"


def literal_forms(dialect: str) -> list[str]:
    """The literal forms :func:`literal_of` writes for ``dialect``."""
    forms = ["standard", "number"]
    if dialect == "postgresql":
        forms += ["escape", "dollar", "tagged", "unicode"]
    if dialect == "mysql":
        forms += ["backslash", "double", "hex", "introducer"]
    if dialect == "sqlite":
        forms += ["hex"]
    return forms


def literal_of(form: str, text: str, dialect: str) -> str:
    """``text`` as a literal of ``form`` (see :func:`literal_forms`), escaped as that form
    needs (a number ignores ``text``)."""
    if form == "number":
        return str(len(text))
    if form == "hex":
        return "X'" + text.encode().hex() + "'"
    if form == "escape":  # PostgreSQL E'…': backslash escapes
        return "E'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if form == "dollar":
        return "$$" + text.replace("$", "") + "$$"
    if form == "tagged":
        return "$paw$" + text.replace("$", "") + "$paw$"
    if form == "unicode":  # U&'…' without the escape character in it
        return "U&'" + text.replace("\\", "").replace("'", "''") + "'"
    if form in ("backslash", "introducer"):  # MySQL: backslash escapes in every string
        body = "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
        return ("_utf8mb4" + body) if form == "introducer" else body
    if form == "double":
        return '"' + text.replace("\\", "\\\\").replace('"', '""') + '"'
    # Standard '…': quotes doubled; in MySQL a backslash still escapes, so double it too.
    body = text.replace("\\", "\\\\") if dialect == "mysql" else text
    return "'" + body.replace("'", "''") + "'"


@st.composite
def literal(draw, dialect: str) -> str:
    """A literal of one of the dialect's forms, its content full of quotes, backslashes
    and delimiters."""
    return literal_of(draw(st.sampled_from(literal_forms(dialect))), draw(_content), dialect)


@st.composite
def effect_call(draw, dialect: str) -> str:
    """A call of a side-effect function, its name in any case (or schema-qualified, or
    quoted, as the dialect allows), comments between its name, parenthesis and arguments."""
    name, arguments = draw(st.sampled_from(EFFECTS[dialect]))
    form = draw(st.sampled_from(["plain", "case", "qualified", "quoted"]))
    if form == "case":
        name = "".join(
            c.upper() if flip else c
            for c, flip in zip(name, draw(st.lists(st.booleans(), min_size=len(name), max_size=len(name))), strict=True)
        )  # fmt: skip
    elif form == "qualified":
        name = {"postgresql": "pg_catalog.", "mysql": "", "sqlite": "main."}[dialect] + name
        if dialect == "sqlite":
            name = name.removeprefix("main.")  # SQLite has no qualified functions
    elif form == "quoted" and dialect != "mysql":  # MySQL reads `name`( as a stored function
        name = f'"{name}"'
    parts = [draw(noise(dialect)) + argument + draw(noise(dialect)) for argument in arguments]
    return name + draw(noise(dialect)) + "(" + ",".join(parts) + ")"


@st.composite
def attack(draw, dialect: str) -> str:
    """One statement that writes or calls a side-effect function, dressed as a read."""

    def n() -> str:
        return draw(noise(dialect))

    def lit() -> str:
        return draw(literal(dialect))

    write = draw(st.sampled_from(WRITES[dialect]))
    call = draw(effect_call(dialect))
    shapes = [
        f"SELECT{n()}{lit()}{n()},{n()}{call}{n()}AS x",
        f"SELECT{n()}{call}",
        f"SELECT a FROM paw_probe WHERE {lit()} ={n()}{lit()} OR {call} IS NULL",
        f"SELECT{n()}(SELECT {call}){n()}",
        f"SELECT{n()}{lit()}{n()};{n()}{write}",
        f"{n()}{write}{n()}",
    ]
    if dialect != "sqlite":
        shapes.append(f"SELECT * FROM paw_probe{n()}FOR UPDATE")
    if dialect == "postgresql":
        shapes += [
            f"WITH w AS ({write} RETURNING a){n()}SELECT {lit()}, a FROM w",
            f"EXPLAIN ANALYZE{n()}{write}",
            f"SELECT * FROM {call} AS f",
        ]
    return draw(st.sampled_from(shapes))


#: The call each database's read-side check looks for: it leaves a mark when it runs.
PROBES = {
    "postgresql": "set_config('paw.probe', 'hit', false)",
    "mysql": "@paw_probe := 1",
    "sqlite": "randomblob(8)",
}


@st.composite
def hiding_read(draw, dialect: str) -> str:
    """A read whose comments and literals hold the *text* of side-effect calls (the
    database's probe among them): only a read when the database will run none of them."""
    hidden = [PROBES[dialect], *(f"{n}({','.join(a)})" for n, a in EFFECTS[dialect])]
    columns = []
    for i in range(draw(st.integers(min_value=1, max_value=3))):
        # What would end the literal or comment early if the database read it otherwise
        # (a backslash before a quote, a quote, a comment's end), then the call, then what
        # would hide the rest of the line.
        before = draw(
            st.sampled_from(["\\', ", "', ", "\\", "--", "/*", "*/", "\n", ";", "$$", ""])
        )
        after = draw(st.sampled_from([" -- ", " /* ", "", ")"]))
        content = before + draw(st.sampled_from(hidden)) + after + draw(_content)
        place = draw(st.sampled_from(["literal", "block", "line"]))
        if place == "literal":
            form = draw(st.sampled_from([f for f in literal_forms(dialect) if f != "number"]))
            columns.append(f"{literal_of(form, content, dialect)} AS c{i}")
        elif place == "block":  # a space after /*: never MySQL's executable /*!
            body = content.replace("*/", "").replace("/*", "")
            columns.append(f"{i} /* {body} */ AS c{i}")
        else:
            columns.append(f"{i} -- {content.replace(chr(10), ' ')}\n AS c{i}")
    return "SELECT " + ", ".join(columns)
