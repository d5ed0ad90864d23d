"""What an answer rests on (``result.lineage``): the knowledge a run was given and the
entries its ``search_knowledge`` retrieved (ids, kinds and titles from PAW's own rows), the
tables and columns its statements that ran read (parsed), its datasources; in the API, in
``POST /api/sql/ask``'s run, in the exports. End to end with the real worker, paw-agent and
the scripted model on a SQLite datasource; a runtime naming entries it was not given is
not believed."""

from __future__ import annotations

import json
import re
import sqlite3

import pytest

from conversations.models import Run
from conversations.selectors.lineage import lineage_summary
from conversations.services.runs import error_entry, run_finish, run_start
from conversations.services.workspaces import workspace_ensure
from secrets_vault.models import KnowledgeEntry
from secrets_vault.services.knowledge import datasource_schema_refresh, knowledge_entry_create
from tests.conftest import SCRIPTED_API_KEY
from tests.factories import ConversationFactory, datasource_made
from tests.live import wait_for
from tests.sandboxes.scenarios import FAKE

pytestmark = [pytest.mark.django_db(transaction=True)]

QUESTION = "What is the revenue per customer?"
JOIN = (
    "SELECT c.name, sum(o.total) AS revenue FROM orders o "
    "JOIN customers c ON c.id = o.customer_id GROUP BY c.name ORDER BY c.name"
)


def shop_database(path) -> None:
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, city TEXT)")
        db.execute(
            "CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER "
            "REFERENCES customers(id), total REAL, day TEXT)"
        )
        db.execute("CREATE TABLE staff (id INTEGER PRIMARY KEY, name TEXT)")
        db.executemany(
            "INSERT INTO customers VALUES (?, ?, ?)", [(1, "Ada", "Oslo"), (2, "Bo", "Rome")]
        )
        db.executemany(
            "INSERT INTO orders VALUES (?, ?, ?, ?)",
            [(1, 1, 20.5, "2026-11-01"), (2, 2, 31.0, "2026-11-02"), (3, 1, 12.25, "2026-12-01")],
        )


@pytest.fixture
def shop(tmp_path):
    """Datasource ``shop`` (SQLite: customers, orders, staff) with its harvested schema, a
    doc *Revenue*, an example *Monthly revenue* and a doc *Refunds* that the question's
    words do not find (only a search does)."""
    path = tmp_path / "shop.sqlite3"
    shop_database(path)
    datasource = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(path)}
    )
    datasource_schema_refresh(datasource_id=datasource.pk, user=None)
    knowledge_entry_create(
        datasource=datasource, kind="doc", title="Revenue",
        text="Revenue is the sum of orders.total, in EUR.", user=None,
    )  # fmt: skip
    knowledge_entry_create(
        datasource=datasource, kind="example", title="Monthly revenue",
        sql="SELECT substr(day, 1, 7) AS month, sum(total) AS revenue FROM orders GROUP BY month",
        user=None,
    )  # fmt: skip
    knowledge_entry_create(
        datasource=datasource, kind="doc", title="Refunds",
        text="Refunds are stored as negative totals.", user=None,
    )  # fmt: skip
    return datasource


def entry(datasource, kind: str, title: str, source: str) -> dict:
    found = KnowledgeEntry.objects.get(datasource=datasource, kind=kind, title=title)
    return {"id": found.pk, "kind": kind, "title": title, "datasource": "shop", "source": source}


def tool_call(name: str, **arguments) -> dict:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def finished_run(api, started: dict) -> dict:
    url = f"/api/conversations/{started['conversation_id']}/runs/{started['id']}"
    return wait_for(
        lambda: (run := api.get(url).json())["status"] in ("done", "error", "cancelled") and run,
        timeout=90,
        what="the run to end",
    )


def export(api, conversation_id: str, export_format: str) -> bytes:
    response = api.get(f"/api/conversations/{conversation_id}/export?format={export_format}")
    assert response.status_code == 200
    return b"".join(response.streaming_content)


@pytest.mark.slow
def test_a_sql_question_records_the_knowledge_given_and_retrieved_and_what_its_join_read(
    api, celery_worker, scripted_model, shop
):
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "rules": [
                {
                    "match": re.escape(QUESTION),
                    "responses": [
                        tool_call("search_knowledge", query="refunds negative"),
                        tool_call("run_sql", datasource="shop", query="SELECT nope FROM staff"),
                        tool_call("run_sql", datasource="shop", query=JOIN),
                        {"text": "Per customer:\n\n{{tool_result}}"},
                    ],
                }
            ],
        }
    )
    started = api.post("/api/sql/ask", {"datasource": "shop", "question": QUESTION}, format="json")
    assert started.status_code == 202, started.json()
    assert started.json()["result"] is None  # queued: nothing to rest on yet
    run = finished_run(api, started.json())
    assert run["status"] == "done", run["errors"]
    assert run["result"]["rows"] == [["Ada", 32.75], ["Bo", 31.0]]
    lineage = run["result"]["lineage"]
    # Given: what the worker chose for the question (its words find these four), in its
    # order; retrieved: what the agent's search found beyond them. Ids, kinds and titles
    # are PAW's rows'. The failed statement on staff read nothing; the join read both.
    given = [e for e in lineage["entries"] if e["source"] == "given"]
    assert sorted(given, key=lambda e: e["title"]) == [
        entry(shop, "example", "Monthly revenue", "given"),
        entry(shop, "doc", "Revenue", "given"),
        entry(shop, "schema", "customers", "given"),
        entry(shop, "schema", "orders", "given"),
    ]
    assert given == [
        {**g, "source": "given"} for g in Run.objects.get(id=run["id"]).knowledge_given
    ]
    assert lineage == {
        "datasources": ["shop"],
        "entries": [*given, entry(shop, "doc", "Refunds", "retrieved")],
        "tables": ["customers", "orders"],
        "columns": ["customers.id", "customers.name", "orders.customer_id", "orders.total"],
    }
    # What the model was given is what the lineage says was given.
    request = next(
        body for body in scripted_model.requests
        if body.get("tools") and QUESTION in json.dumps(body["messages"])
    )  # fmt: skip
    system = "\n".join(m["content"] for m in request["messages"] if m["role"] == "system")
    for item in given:
        assert f"[{item['kind']}] {item['title']} (datasource shop)" in system
    assert "[doc] Refunds" not in system

    conversation = run["conversation_id"]
    markdown = export(api, conversation, "md").decode()
    based_on = (
        "Based on: `customers`, `orders`; docs *Revenue*, *Refunds*; example *Monthly revenue*"
    )
    assert "**Answer**\n\nPer customer:" in markdown and f"\n\n{based_on}\n" in markdown
    body = json.loads(export(api, conversation, "json"))
    assert body["lineage"] == [{"run_id": run["id"], "lineage": lineage}]
    notebook = json.loads(export(api, conversation, "ipynb"))
    [closing] = [c for c in notebook["cells"] if c["metadata"].get("paw", {}).get("lineage")]
    assert closing["metadata"]["paw"] == {"run": run["id"], "lineage": lineage}
    assert based_on in "".join(closing["source"])


@pytest.mark.slow
def test_entries_a_runtime_names_that_are_not_of_the_runs_datasources_are_ignored(
    worker_node, shop, tmp_path
):
    """The runtime is untrusted: of the ids its search_knowledge line names, only entries
    of the run's datasources count, with PAW's kind and title; a failed search counts for
    nothing; and a runtime without knowledge was given none."""
    worker_node.use(FAKE, PAW_SANDBOX_ISOLATION="none")
    other_path = tmp_path / "other.sqlite3"
    shop_database(other_path)
    other = datasource_made(
        slug="other", name="Other", dialect="sqlite", connection={"database": str(other_path)}
    )
    foreign = knowledge_entry_create(
        datasource=other, kind="doc", title="Secret plans", text="Not for shop.", user=None
    )
    refunds = KnowledgeEntry.objects.get(datasource=shop, title="Refunds")
    revenue = KnowledgeEntry.objects.get(datasource=shop, title="Revenue")
    missing = max(KnowledgeEntry.objects.values_list("pk", flat=True)) + 100
    conversation = ConversationFactory()
    mode = f"forged-lineage {refunds.pk} {foreign.pk} {missing} {refunds.pk} -- {revenue.pk}"
    (workspace_ensure(conversation.id) / "fake_mode").write_text(mode)
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="go", datasources=["shop"]
    )
    ended = wait_for(
        lambda: Run.objects.filter(id=run.id, status__in=Run.FINISHED_STATUSES).first(),
        what="the run to end",
    )
    assert ended.status == Run.Status.DONE, ended.errors
    assert ended.result == {
        "lineage": {
            "datasources": ["shop"],
            "entries": [entry(shop, "doc", "Refunds", "retrieved")],
            "tables": ["customers", "orders"],
            "columns": ["customers.id", "customers.name", "orders.customer_id", "orders.total"],
        }
    }


def finished_without_a_worker(datasources: list[str]) -> Run:
    """A run of a new conversation that ends without ever reaching a runtime (as a run
    whose sandbox failed to start does), read back."""
    conversation = ConversationFactory()
    run = Run.objects.create(
        conversation=conversation, user=conversation.user, prompt="hi", datasources=datasources
    )
    run_finish(run_id=run.id, status=Run.Status.ERROR, errors=[error_entry("sandbox_start", "no")])
    return Run.objects.get(id=run.id)


def test_a_run_on_a_datasource_that_never_ran_has_a_lineage_of_its_datasource_only(shop):
    assert finished_without_a_worker(["shop"]).result == {
        "lineage": {"datasources": ["shop"], "entries": [], "tables": [], "columns": []}
    }


def test_a_run_on_no_datasource_has_no_lineage():
    assert finished_without_a_worker([]).result is None


def test_the_summary_names_the_tables_then_the_docs_and_examples():
    lineage = {
        "datasources": ["shop"],
        "entries": [
            {"id": 1, "kind": "schema", "title": "orders", "datasource": "shop", "source": "given"},
            {"id": 2, "kind": "doc", "title": "Revenue", "datasource": "shop", "source": "given"},
            {
                "id": 3,
                "kind": "example",
                "title": "Monthly *revenue*",
                "datasource": "shop",
                "source": "retrieved",
            },
        ],
        "tables": ["orders", "customers"],
        "columns": ["orders.total"],
    }
    assert lineage_summary(lineage) == (
        "Based on: `orders`, `customers`; doc *Revenue*; example *Monthly \\*revenue\\**"
    )
    assert lineage_summary({**lineage, "entries": [], "tables": []}) == ""
    assert lineage_summary(None) == ""
