"""The ``%%agent`` magic in a real Jupyter kernel (ipykernel), executed by nbclient against
a real PAW stack: streamed text shown once (updated in place), the chart as image/png, a
CSV artifact as an HTML table, a DataFrame of the notebook received by the agent, an
approval answered through input(), errors as one line."""

from __future__ import annotations

import asyncio
import contextlib

import nbformat
import pytest
from nbclient import NotebookClient

from conversations.models import Approval, Run, RunEvent
from conversations.selectors.workspaces import workspace_path
from tests.conftest import SCRIPTED_API_KEY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

CODE = (
    "import pandas as pd\n"
    "import matplotlib\n"
    "matplotlib.use('Agg')\n"
    "import matplotlib.pyplot as plt\n"
    "tips = pd.read_csv('tips.csv')\n"
    "summary = tips.groupby('day', sort=False)['tip'].mean().round(2)\n"
    "print('averages:', summary.to_dict())\n"
    "summary.to_csv('summary.csv', header=['average tip'])\n"
    "summary.plot.bar()\n"
    "plt.savefig('chart.png')\n"
    "plt.close('all')\n"
)
INTRO = "Computing the average tip per day from your DataFrame now."

SCRIPT = {
    "api_key": SCRIPTED_API_KEY,
    "rules": [
        {
            "match": "average tip",
            "when_tool": "run_python",
            "responses": [
                {"text": INTRO + "\n\n", "chunk": 4,
                 "tool_calls": [{"name": "run_python", "arguments": {"code": CODE}}]},
                {"text": "Here it is: {{tool_result}}", "chunk": 6},
            ],
        },
        {
            "match": "delete the summary",
            "when_tool": "delete_file",
            "responses": [
                {"text": "Deleting summary.csv. ",
                 "tool_calls": [{"name": "delete_file", "arguments": {"path": "summary.csv"}}]},
                "The tool said: {{tool_result}}",
            ],
        },
    ],
}  # fmt: skip

# The notebook's own data: averages no other data set has (Thur 1.5, Fri 7.25).
FRAME = "tips = pd.DataFrame({'day': ['Thur', 'Thur', 'Fri', 'Fri'], 'tip': [1.0, 2.0, 7.0, 7.5]})"


def notebook(base: str) -> nbformat.NotebookNode:
    cells = [
        "%load_ext paw_client",
        f"%paw_connect {base}",
        "import pandas as pd\n" + FRAME,
        "%%agent --df tips\naverage tip by day, and a chart",
        "result = _\nprint(result.dataframe('summary.csv').to_csv(index=False))\nprint(result.usage.total > 0)",
        "%%agent\ndelete the summary",
        "%%agent --provider openai\nthis provider has no key",
        "%%agent --df nothing_here\nhello",
    ]
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])


def execute(
    nb: nbformat.NotebookNode, answers: list[str], prompts: list[str], cwd, replies=None
) -> None:
    """Run ``nb`` in a fresh ipykernel, answering the kernel's input() requests with
    ``answers`` (each prompt recorded in ``prompts``): nbclient itself declines stdin, so
    the test serves the kernel's stdin channel. ``replies`` (a dict), when given, gets
    each cell's ``execute_reply`` content by cell index (its ``payload``: what
    ``set_next_input`` sent)."""

    async def serve_stdin(client: NotebookClient) -> None:
        while True:
            message = await client.kc.stdin_channel.get_msg()
            if message["header"]["msg_type"] == "input_request":
                prompts.append(message["content"]["prompt"])
                client.kc.input(answers.pop(0) if answers else "")

    tasks: list[asyncio.Task] = []

    def on_start(notebook=None, **_):
        runner.kc.allow_stdin = True
        tasks.append(asyncio.ensure_future(serve_stdin(runner)))

    async def on_complete(notebook=None, **_):
        for task in tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def on_executed(cell=None, cell_index=None, execute_reply=None, **_):
        if replies is not None:
            replies[cell_index] = execute_reply["content"]

    runner = NotebookClient(
        nb, timeout=180, kernel_name="python3", resources={"metadata": {"path": str(cwd)}},
        on_notebook_start=on_start, on_notebook_complete=on_complete,
        on_cell_executed=on_executed,
    )  # fmt: skip
    runner.execute()


def texts(output) -> str:
    if output.output_type == "stream":
        return output.text
    return "".join(str(v) for v in output.get("data", {}).values())


def test_the_agent_magic_in_a_real_kernel(stack, person, scripted_model, tmp_path, monkeypatch):
    scripted_model.load(SCRIPT)
    monkeypatch.setenv("PAW_TOKEN", person.token)
    nb = notebook(stack.base)
    prompts: list[str] = []
    execute(nb, ["y"], prompts, tmp_path)
    cells = nb.cells
    assert "Connected to" in texts(cells[1].outputs[0]) and "as ada" in texts(cells[1].outputs[0])

    ask = cells[3].outputs
    assert not [o for o in ask if o.output_type == "error"], ask
    # The streamed text: one output, updated in place, holding the whole text once.
    with_text = [o for o in ask if INTRO in texts(o)]
    assert len(with_text) == 1 and texts(with_text[0]).count(INTRO) == 2  # plain + markdown
    assert with_text[0].output_type == "display_data"
    # Tool rows with their status; the chart inline; the CSV as an HTML table.
    tools = [o for o in ask if "paw-tools" in o.get("data", {}).get("text/html", "")]
    assert len(tools) == 1 and "run_python(code=" in tools[0]["data"]["text/plain"]
    assert "[ok]" in tools[0]["data"]["text/plain"]
    images = [o for o in ask if "image/png" in o.get("data", {})]
    assert len(images) == 1, [o.metadata for o in images]
    tables = [
        o for o in ask if "<table" in o.get("data", {}).get("text/html", "") and o not in tools
    ]
    assert len(tables) == 1 and "7.25" in tables[0]["data"]["text/html"]
    assert "AgentResult done" in texts(next(o for o in ask if o.output_type == "execute_result"))

    # The agent worked on the notebook's DataFrame: the tool's result (echoed into the
    # answer by the script: "{{tool_result}}") has its averages, and the upload is its CSV.
    run = Run.objects.filter(conversation__user=person.user).order_by("created_at").first()
    assert "averages: {'Thur': 1.5, 'Fri': 7.25}" in run.answer
    (tool,) = RunEvent.objects.filter(run=run, type="notify", kind="tool")
    assert tool.payload["data"]["ok"] is True
    upload = run.conversation.files.get()
    assert upload.name == "tips.csv"
    frame = (workspace_path(run.conversation_id) / "tips.csv").read_text()
    assert frame.splitlines() == ["day,tip", "Thur,1.0", "Thur,2.0", "Fri,7.0", "Fri,7.5"]

    # The next cell used the result: the table as a DataFrame, and the usage.
    assert texts(cells[4].outputs[0]).split() == [
        "day,average",
        "tip",
        "Thur,1.5",
        "Fri,7.25",
        "True",
    ]

    # The approval was asked through input(), with its deadline, and answered "y".
    (prompt,) = prompts
    assert "summary.csv" in prompt and "s left" in prompt and prompt.endswith("Approve? [y/N] ")
    approval = Approval.objects.get(run__conversation=run.conversation)
    assert approval.status == "approved" and approval.decided_by == "user"
    assert not (workspace_path(run.conversation_id) / "summary.csv").exists()
    # Same conversation: the magic kept it between cells.
    assert Run.objects.filter(conversation=run.conversation).count() == 2

    # Errors: one readable line each, no traceback.
    for cell, expected in (
        (cells[6], "PAW: provider_inactive: "),
        (cells[7], "PAW: --df nothing_here"),
    ):
        assert [o.output_type for o in cell.outputs] == ["stream"], cell.outputs
        assert cell.outputs[0].name == "stderr" and cell.outputs[0].text.startswith(expected)
        assert cell.outputs[0].text.count("\n") == 1


def test_the_agent_magic_shows_a_verified_query(
    stack, person, scripted_model, tmp_path, monkeypatch
):
    """A cell whose run's result ran a verified example's SQL (reformatted) shows
    "✓ verified query: <title>"; a cell whose query is another's shows none."""
    import sqlite3

    from django.contrib.auth import get_user_model

    from secrets_vault.services.knowledge import knowledge_entry_create, knowledge_entry_verify
    from tests.factories import datasource_made

    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, day TEXT, total REAL)")
        db.executemany(
            "INSERT INTO orders (day, total) VALUES (?, ?)", [("Sat", 2.0), ("Sun", 3.0)]
        )
    shop = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(path)}
    )
    staff = get_user_model().objects.create_superuser("checker", password=None)
    entry = knowledge_entry_create(
        datasource=shop, kind="example", title="Sales per day", user=None,
        sql="SELECT day, sum(total) AS total FROM orders GROUP BY day",
    )  # fmt: skip
    knowledge_entry_verify(entry=entry, user=staff)

    def sql_rule(match: str, query: str) -> dict:
        call = {"name": "run_sql", "arguments": {"datasource": "shop", "query": query}}
        return {"match": match, "responses": [{"tool_calls": [call]}, "Done: {{tool_result}}"]}

    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "rules": [
                sql_rule(
                    "sales per day", "select DAY, SUM(total) total\nfrom ORDERS group by day;"
                ),
                sql_rule("sales of sunday", "SELECT sum(total) FROM orders WHERE day = 'Sun'"),
            ],
        }
    )
    monkeypatch.setenv("PAW_TOKEN", person.token)
    cells = [
        "%load_ext paw_client",
        f"%paw_connect {stack.base}",
        "%%agent --datasource shop\nsales per day",
        "%%agent --datasource shop\nsales of sunday",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    execute(nb, [], [], tmp_path)
    verified, other = nb.cells[2].outputs, nb.cells[3].outputs
    assert not [o for o in verified + other if o.output_type == "error"]
    notes = [o for o in verified if "verified query" in texts(o)]
    assert len(notes) == 1, verified
    assert notes[0]["data"]["text/plain"] == "✓ verified query: Sales per day"
    assert "paw-verified" in notes[0]["data"]["text/html"]
    assert not [o for o in other if "verified query" in texts(o)], other
    runs = Run.objects.filter(conversation__user=person.user).order_by("created_at")
    assert [("verified" in (r.result or {})) for r in runs] == [True, False]
