"""The ``%%agent`` magic as notebook users expect it (issue 28, part 6), in a real Jupyter
kernel (nbclient + ipykernel) against a real PAW stack: ``{name}`` filled with the
notebook's variables (a DataFrame by its shape and first rows) while other braces stay as
written, ``--no-interpolate``, ``--out NAME``, ``%agent fix`` after a real exception (the
model gets the cells and the traceback, the corrected cell comes back as the next cell)
and with none yet, and the answer's SQL and lineage in the cell's output metadata."""

from __future__ import annotations

import sqlite3

import nbformat
import pytest

from conversations.models import Run
from paw_client.magic import TRACEBACK_MAX_CHARS
from tests.clients.test_magic import execute, texts
from tests.conftest import SCRIPTED_API_KEY
from tests.factories import datasource_made

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def notebook(*cells: str | tuple[str, list[str]]) -> nbformat.NotebookNode:
    """Code cells; a ``(source, tags)`` pair is a tagged cell (``raises-exception``)."""
    made = []
    for cell in cells:
        source, tags = cell if isinstance(cell, tuple) else (cell, [])
        made.append(nbformat.v4.new_code_cell(source, metadata={"tags": tags}))
    return nbformat.v4.new_notebook(cells=made)


def connected(stack, person, monkeypatch, *cells) -> nbformat.NotebookNode:
    """A notebook that loads the magic and connects to ``stack`` as ``person`` (its token
    in ``PAW_TOKEN``), then ``cells``."""
    monkeypatch.setenv("PAW_TOKEN", person.token)
    return notebook("%load_ext paw_client", f"%paw_connect {stack.base}", *cells)


def scripted(model, script: dict) -> None:
    """Load ``script`` into the scripted model, with an empty request log."""
    model.load(script)
    model.clear_log()


def paw_metadata(cell) -> list[dict]:
    """The ``paw`` metadata of the cell's outputs (one per answered run)."""
    return [o.metadata["paw"] for o in cell.outputs if "paw" in o.get("metadata", {})]


def user_message(body: dict) -> str:
    """The latest user message of a chat request the model received."""
    return next(m["content"] for m in reversed(body["messages"]) if m["role"] == "user")


ECHO = {
    "api_key": SCRIPTED_API_KEY,
    "untooled": "Title",
    "rules": [{"match": "^echo", "responses": [{"text": "You said: {{prompt}}"}]}],
}
FRAME = "tips = pd.DataFrame({'day': ['Thur', 'Thur', 'Fri'], 'tip': [1.25, 2.5, 7.75]})"
ASK = (
    'echo the frame {tips}; the limit {limit} ({limit.real}); a dict {"a": 1}; a set '
    "{x for x in y}; {{limit}}; {undefined_name}; {_private}; {tips.nope}"
)


def test_variables_are_interpolated_other_braces_stay_and_out_keeps_the_result(
    stack, person, scripted_model, tmp_path, monkeypatch
):
    scripted(scripted_model, ECHO)
    nb = connected(
        stack,
        person,
        monkeypatch,
        "import pandas as pd\n" + FRAME + "\nlimit = 3\n_private = 'secret'",
        f"%%agent --out first\n{ASK}",
        "print(first is _, type(first).__name__, first.answer.startswith('You said: echo'))",
        "%%agent --no-interpolate\necho as written: {tips} and {limit}",
        "%%agent --out 1st\necho never sent",
        "%%agent --out class\necho never sent",
    )
    execute(nb, [], [], tmp_path)
    cells = nb.cells
    runs = list(Run.objects.filter(conversation__user=person.user).order_by("created_at"))
    assert len(runs) == 2  # the two bad --out names sent nothing

    # The variables became their values; every other brace was sent as written.
    sent = runs[0].prompt
    assert sent.startswith("echo the frame \n```text\nDataFrame tips: 3 rows x 2 columns\n")
    assert "columns: day (object), tip (float64)" in sent and "first rows:" in sent
    assert "\n2   Fri  7.75\n" in sent  # the frame's last row, as pandas prints it
    assert "; the limit 3 (3); " in sent
    for kept in ('{"a": 1}', "{x for x in y}", "{{limit}}", "{undefined_name}", "{_private}"):
        assert kept in sent, kept
    assert "{tips.nope}" in sent and "secret" not in sent
    # ... and that is what the model received, and answered.
    asked = [b for b in scripted_model.requests if b.get("tools")]
    assert user_message(asked[0]) == sent
    assert runs[0].answer == "You said: " + sent

    # --out NAME: the result object is in NAME as well as in _.
    assert not [o for o in cells[3].outputs if o.output_type == "error"], cells[3].outputs
    assert texts(cells[4].outputs[0]).split() == ["True", "AgentResult", "True"]
    # --no-interpolate: the cell as written.
    assert runs[1].prompt == "echo as written: {tips} and {limit}"
    assert user_message(asked[1]) == runs[1].prompt
    # A bad --out name: one line on stderr, nothing sent.
    for cell, name in ((cells[6], "1st"), (cells[7], "class")):
        [output] = cell.outputs
        assert output.output_type == "stream" and output.name == "stderr"
        assert output.text == f"PAW: --out {name}: not a Python variable name.\n"

    # Each answered cell carries its run in its output metadata; a chat run read no SQL.
    for cell, run in ((cells[3], runs[0]), (cells[5], runs[1])):
        [meta] = paw_metadata(cell)
        assert meta["run"] == str(run.id) and meta["conversation"] == str(run.conversation_id)
        assert meta["sql"] == []
        assert meta["lineage"] is None or not meta["lineage"].get("tables")


FIRST = "SELECT count(*) AS orders FROM orders"
QUERY = "SELECT day, sum(total) AS total FROM orders GROUP BY day ORDER BY day"


def test_the_answers_sql_and_lineage_are_in_the_cells_output_metadata(
    stack, person, scripted_model, tmp_path, monkeypatch
):
    shop = tmp_path / "shop.sqlite3"
    with sqlite3.connect(shop) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, day TEXT, total REAL)")
        db.executemany(
            "INSERT INTO orders (day, total) VALUES (?, ?)", [("Sat", 20.5), ("Sun", 31.0)]
        )
    datasource_made(slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop)})
    scripted(
        scripted_model,
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "rules": [
                {
                    "match": r"sales per day",
                    "responses": [
                        {
                            "tool_calls": [
                                {
                                    "name": "run_sql",
                                    "arguments": {"datasource": "shop", "query": query},
                                }
                            ]
                        }
                        for query in (FIRST, QUERY)
                    ]
                    + [{"text": "Sunday sold most."}],
                }
            ],
        },
    )
    nb = connected(
        stack,
        person,
        monkeypatch,
        "%%agent --datasource shop --out sales\nsales per day?",
        "print(sales.sql[-1] == sales.run.result['sql'], len(sales.sql), sales.answer)",
    )
    execute(nb, [], [], tmp_path)
    cell = nb.cells[2]
    assert not [o for o in cell.outputs if o.output_type == "error"], cell.outputs
    run = Run.objects.get(conversation__user=person.user)
    assert run.status == "done" and run.result["sql"] == QUERY

    [meta] = paw_metadata(cell)
    assert meta["run"] == str(run.id) and meta["conversation"] == str(run.conversation_id)
    assert meta["sql"] == [FIRST, QUERY]  # both queries, the run's result being the last
    lineage = meta["lineage"]  # recorded by the server (conversations.services.lineage)
    assert lineage == run.result["lineage"]
    assert "shop" in lineage["datasources"]
    assert any("orders" in table for table in lineage["tables"])
    # The same output shows it: the SQL, the run, and the cell is the run's last output.
    [shown] = [o for o in cell.outputs if "paw" in o.get("metadata", {})]
    assert f"```sql\n{FIRST}\n```\n\n```sql\n{QUERY}\n```" in shown["data"]["text/markdown"]
    assert f"run {run.id}" in shown["data"]["text/plain"]
    assert texts(nb.cells[3].outputs[0]).split() == ["True", "2", "Sunday", "sold", "most."]


FIX = "total = 10\nratio(total, 1)"
FIX_SCRIPT = {
    "api_key": SCRIPTED_API_KEY,
    "untooled": "Title",
    "rules": [
        {
            "match": "raised an exception",
            "responses": [
                {"text": "The divisor is zero, so `a / b` fails.\n\n```python\n" + FIX + "\n```\n"}
            ],
        }
    ],
}


def test_agent_fix_sends_the_last_exception_and_puts_the_corrected_cell_next(
    stack, person, scripted_model, tmp_path, monkeypatch
):
    scripted(scripted_model, FIX_SCRIPT)
    nb = connected(
        stack,
        person,
        monkeypatch,
        "%agent fix",
        "def ratio(a, b):\n    return a / b",
        ("total = 10\nratio(total, 0)", ["raises-exception"]),
        "%agent fix --out fixed",
        "print(repr(fixed.corrected_cell))",
        ("x = (1,", ["raises-exception"]),
        "%agent fix",
        "%agent repair",
        ("raise ValueError('x' * 50_000)", ["raises-exception"]),
        "%agent fix",
    )
    replies: dict[int, dict] = {}
    execute(nb, [], [], tmp_path, replies)
    cells = nb.cells

    # No exception yet: one line, nothing sent.
    [output] = cells[2].outputs
    assert output.output_type == "stream" and output.name == "stderr"
    assert output.text.startswith("PAW: no exception yet in this notebook")
    assert [o.ename for o in cells[4].outputs if o.output_type == "error"] == ["ZeroDivisionError"]

    runs = list(Run.objects.filter(conversation__user=person.user).order_by("created_at"))
    assert len(runs) == 3  # the three fixes, nothing for "no exception yet"
    asked = [user_message(b) for b in scripted_model.requests if b.get("tools")]
    assert asked == [r.prompt for r in runs]
    # The model got the cell that raised (as typed), the cell of the function it called,
    # and the traceback without IPython's own frames.
    prompt = asked[0]
    assert "The cell that raised it, In[5]:\n```python\ntotal = 10\nratio(total, 0)\n```" in prompt
    assert "Also in the traceback, In[4]:\n```python\ndef ratio(a, b):\n    return a / b\n```" in (
        prompt
    )
    assert "Traceback (most recent call last):\n  Cell In[5], line 2, in <module>" in prompt
    assert "Cell In[4], line 2, in ratio\n    return a / b" in prompt
    assert prompt.rstrip().splitlines()[-1].startswith("Explain briefly what went wrong")
    assert "ZeroDivisionError: division by zero" in prompt
    assert "interactiveshell" not in prompt and "ipykernel" not in prompt

    # The corrected cell: the next cell to insert (set_next_input's payload), printed too,
    # and kept on the result; the answer streamed as usual, the run in the metadata.
    [payload] = replies[5]["payload"]
    assert payload["source"] == "set_next_input" and payload["text"] == FIX
    printed = "".join(o.text for o in cells[5].outputs if o.get("name") == "stdout")
    assert printed == f"The corrected cell (put into the next cell):\n\n{FIX}\n"
    assert any("The divisor is zero" in texts(o) for o in cells[5].outputs)
    assert texts(cells[6].outputs[0]).strip() == repr(FIX)
    [meta] = paw_metadata(cells[5])
    assert meta["run"] == str(runs[0].id) and meta["sql"] == []

    # A syntax error is an exception too: its cell, and no frame of IPython's parser.
    prompt = asked[1]
    assert "The cell that raised it, In[8]:\n```python\nx = (1,\n```" in prompt
    assert "SyntaxError" in prompt and "Traceback (most recent call last)" not in prompt
    assert "compilerop" not in prompt and "interactiveshell" not in prompt
    [payload] = replies[8]["payload"]
    assert payload["text"] == FIX

    # A traceback is bounded: its start and its end, what was left out said.
    prompt = asked[2]
    assert TRACEBACK_MAX_CHARS < 50_000 and len(prompt) < TRACEBACK_MAX_CHARS + 1_000
    assert "raise ValueError('x' * 50_000)" in prompt and "characters left out" in prompt
    assert prompt.split("The traceback:")[1].count("x") > TRACEBACK_MAX_CHARS / 2

    # %agent with another word: one line, nothing sent.
    [output] = cells[9].outputs
    assert output.name == "stderr" and output.text.startswith("PAW: %agent takes one command, fix")
