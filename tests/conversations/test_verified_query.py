"""A verified query end to end: the real worker, paw-agent and the scripted model on a real
SQLite datasource. A run (a chat run, and ``POST /api/sql/ask``) whose model issues a
verified example's SQL, reformatted, has ``result.verified``, decided by PAW from its own
database; another literal does not; the Markdown export says so under the answer; a
runtime cannot claim it for a datasource its run was not given."""

from __future__ import annotations

import re
import sqlite3

import pytest
from django.contrib.auth import get_user_model

from conversations.models import Run
from conversations.services.run_effects import verified_query_of
from secrets_vault.services.knowledge import knowledge_entry_create, knowledge_entry_verify
from tests.conftest import SCRIPTED_API_KEY
from tests.factories import conversation_of, datasource_made
from tests.live import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

EXAMPLE_SQL = "SELECT day, sum(total) AS total FROM orders GROUP BY day ORDER BY day"
# The same query as the model might write it: other case, layout, an alias, a semicolon.
REWRITTEN = "select o.DAY, SUM(o.Total) as total\nfrom Orders o\ngroup by o.day\norder by o.day;"
OTHER = "SELECT day, sum(total) AS total FROM orders WHERE day = 'Sun' GROUP BY day ORDER BY day"


@pytest.fixture
def shop(tmp_path):
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, day TEXT, total REAL)")
        db.executemany(
            "INSERT INTO orders (day, total) VALUES (?, ?)",
            [("Sat", 20.5), ("Sun", 31.0), ("Sun", 12.25)],
        )
    return datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(path)}
    )


@pytest.fixture
def verified(shop):
    staff = get_user_model().objects.create_superuser("checker", password=None)
    entry = knowledge_entry_create(
        datasource=shop, kind="example", title="Sales per day", sql=EXAMPLE_SQL, user=None
    )
    return knowledge_entry_verify(entry=entry, user=staff)


def script(*rules: tuple[str, str]) -> dict:
    """For each ``(question, query)``: run ``query`` on ``shop``, then answer."""
    return {
        "api_key": SCRIPTED_API_KEY,
        "untooled": "Title",
        "rules": [
            {
                "match": re.escape(question),
                "responses": [
                    {"tool_calls": [{"name": "run_sql", "arguments": {"datasource": "shop", "query": query}}]},
                    {"text": "Per day:\n\n{{tool_result}}"},
                ],
            }
            for question, query in rules
        ],
    }  # fmt: skip


def finished(api, conversation_id: str, run_id: str) -> dict:
    url = f"/api/conversations/{conversation_id}/runs/{run_id}"
    return wait_for(
        lambda: (run := api.get(url).json())["status"] in ("done", "error", "cancelled") and run,
        timeout=90,
        what="the run to end",
    )


def expected(entry) -> dict:
    return {
        "id": entry.pk,
        "title": "Sales per day",
        "datasource": "shop",
        "verified_at": entry.verified_at.isoformat(),
    }


def test_a_chat_run_that_runs_a_verified_examples_sql_has_a_verified_result(
    api, celery_worker, scripted_model, shop, verified
):
    scripted_model.load(script(("Sales per day?", REWRITTEN), ("Sales on Sunday?", OTHER)))
    conversation = api.post("/api/conversations", {"datasources": ["shop"]}, format="json").json()
    runs = f"/api/conversations/{conversation['id']}/runs"
    started = api.post(runs, {"prompt": "Sales per day?"}, format="json").json()
    run = finished(api, conversation["id"], started["id"])
    assert run["status"] == "done", run["errors"]
    assert run["result"]["sql"] == REWRITTEN  # what ran, as the model wrote it
    assert run["result"]["rows"] == [["Sat", 20.5], ["Sun", 43.25]]
    assert run["result"]["verified"] == expected(verified)
    assert Run.objects.get(id=run["id"]).result["verified"] == expected(verified)

    # Another literal is another query: no verified mark.
    second = api.post(runs, {"prompt": "Sales on Sunday?"}, format="json").json()
    other = finished(api, conversation["id"], second["id"])
    assert other["status"] == "done", other["errors"]
    assert other["result"]["rows"] == [["Sun", 43.25]]
    assert "verified" not in other["result"]

    export = api.get(f"/api/conversations/{conversation['id']}/export?format=md")
    text = b"".join(export.streaming_content).decode()
    assert text.count("*✓ Verified query: Sales per day*") == 1


def test_sql_ask_answers_with_a_verified_query(api, celery_worker, scripted_model, verified):
    question = "Sales of the shop, day by day?"
    scripted_model.load(script((question, REWRITTEN)))
    started = api.post("/api/sql/ask", {"datasource": "shop", "question": question}, format="json")
    assert started.status_code == 202, started.json()
    run = finished(api, started.json()["conversation_id"], started.json()["id"])
    assert run["status"] == "done", run["errors"]
    assert run["result"]["verified"] == expected(verified)
    # The verified example was given to the run first, labelled for the model.
    request = next(
        body
        for body in reversed(scripted_model.requests)
        if body.get("tools")
        and [m for m in body["messages"] if m["role"] == "user"][-1]["content"] == question
    )
    system = "\n".join(m["content"] for m in request["messages"] if m["role"] == "system")
    assert "[example, verified] Sales per day (datasource shop)" in system


def test_a_runtime_cannot_claim_a_verified_query_on_a_datasource_its_run_was_not_given(
    user, shop, verified
):
    conversation = conversation_of(user)
    run = Run.objects.create(
        conversation=conversation, user=user, prompt="x", datasources=["elsewhere"]
    )
    claimed = {"datasource": "shop", "sql": EXAMPLE_SQL}
    assert verified_query_of(run_id=run.id, result=claimed) is None
    Run.objects.filter(id=run.id).update(datasources=["shop"])
    assert verified_query_of(run_id=run.id, result=claimed) == expected(verified)
    assert verified_query_of(run_id=run.id, result={**claimed, "sql": OTHER}) is None
