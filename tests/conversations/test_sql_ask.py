"""``POST /api/sql/ask`` end to end: the real worker, paw-agent and the scripted model, on
real SQLite, PostgreSQL and MariaDB datasources. The run is offered only the SQL tools,
gets the datasource's knowledge, ends with its structured ``result``, and a write waits for
an approval."""

from __future__ import annotations

import re
import sqlite3

import pytest

from conversations.models import Approval, Conversation, Run
from secrets_vault.services.knowledge import datasource_schema_refresh
from tests.conftest import SCRIPTED_API_KEY
from tests.factories import datasource_made
from tests.live import wait_for
from tests.mariadb import mariadb_cursor, mariadb_settings
from tests.pgdatasource import pg_datasource_settings

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def script_for(question: str, *steps: dict) -> dict:
    return {
        "api_key": SCRIPTED_API_KEY,
        "untooled": "Title",
        "rules": [{"match": re.escape(question), "responses": list(steps)}],
    }


def sql(datasource: str, query: str) -> dict:
    return {
        "tool_calls": [{"name": "run_sql", "arguments": {"datasource": datasource, "query": query}}]
    }


def finished_run(api, started: dict) -> dict:
    url = f"/api/conversations/{started['conversation_id']}/runs/{started['id']}"
    return wait_for(
        lambda: (run := api.get(url).json())["status"] in ("done", "error", "cancelled") and run,
        timeout=90,
        what="the run to end",
    )


def agent_request(scripted_model, question: str) -> dict:
    return next(
        body for body in scripted_model.requests
        if body.get("tools") and [m for m in body["messages"] if m["role"] == "user"][-1]["content"] == question
    )  # fmt: skip


@pytest.fixture
def shop_file(tmp_path):
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, day TEXT, total REAL)")
        db.executemany(
            "INSERT INTO orders (day, total) VALUES (?, ?)",
            [("Sat", 20.5), ("Sun", 31.0), ("Sun", 12.25)],
        )
        db.execute("CREATE TABLE staff (id INTEGER PRIMARY KEY, name TEXT)")
    return path


def test_a_question_about_a_sqlite_datasource_gets_its_knowledge_only_sql_tools_and_a_result(
    api, celery_worker, scripted_model, shop_file
):
    datasource = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )
    datasource_schema_refresh(datasource_id=datasource.pk, user=None)
    question = "What did the shop sell per day?"
    query = "SELECT day, sum(total) AS total FROM orders GROUP BY day ORDER BY day"
    scripted_model.load(
        script_for(
            question,
            {
                "tool_calls": [
                    {"name": "search_knowledge", "arguments": {"query": "orders per day"}}
                ]
            },
            sql("shop", query),
            {"text": "Per day:\n\n{{tool_result}}\n\n```sql\n" + query + "\n```"},
        )
    )
    before = Conversation.objects.count()
    started = api.post("/api/sql/ask", {"datasource": "shop", "question": question}, format="json")
    assert started.status_code == 202, started.json()
    assert started.json()["status"] == "queued" and started.json()["kind"] == "sql"
    assert Conversation.objects.count() == before + 1
    # A follow-up in the chat (no datasources named) still has the database.
    assert Conversation.objects.get(id=started.json()["conversation_id"]).datasources == ["shop"]
    run = finished_run(api, started.json())
    assert run["status"] == "done", run["errors"]
    assert run["tools"] == ["run_sql", "search_knowledge", "ask_user"]
    lineage = run["result"].pop("lineage")  # what the answer rests on: tests/.../test_lineage.py
    assert run["result"] == {
        "datasource": "shop",
        "sql": query,
        "columns": ["day", "total"],
        "rows": [["Sat", 20.5], ["Sun", 43.25]],
        "row_count": 2,
        "truncated": False,
    }
    assert (lineage["tables"], lineage["columns"]) == (["orders"], ["orders.day", "orders.total"])
    assert "| Sun | 43.25 |" in run["answer"]
    request = agent_request(scripted_model, question)
    assert [t["function"]["name"] for t in request["tools"]] == [
        "search_knowledge",
        "run_sql",
        "ask_user",
    ]
    system = "\n".join(m["content"] for m in request["messages"] if m["role"] == "system")
    assert "answering a question about a database with SQL" in system
    assert "[schema] orders (datasource shop)\nTable orders (3 columns, about 3 rows)." in system
    title = api.get(f"/api/conversations/{run['conversation_id']}").json()["title"]
    assert title == question


def test_a_postgresql_result_keeps_the_first_rows_and_says_it_is_truncated(
    api, worker_node, scripted_model, settings
):
    worker_node.use(PAW_SQL_RESULT_ROWS="5")
    settings.PAW_SQL_RESULT_ROWS = 5
    datasource_made(slug="pg", name="PG", dialect="postgresql", connection=pg_datasource_settings())
    question = "Count to 150"
    scripted_model.load(
        script_for(
            question, sql("pg", "SELECT g FROM generate_series(1, 150) AS g"), {"text": "Done."}
        )
    )
    started = api.post("/api/sql/ask", {"datasource": "pg", "question": question}, format="json")
    run = finished_run(api, started.json())
    assert run["status"] == "done", run["errors"]
    assert run["result"]["rows"] == [[1], [2], [3], [4], [5]]
    assert run["result"]["row_count"] == 150 and run["result"]["truncated"] is True


def test_a_write_asked_on_mariadb_waits_for_approval_in_the_given_conversation(
    api, celery_worker, scripted_model, mariadb
):
    datasource_made(
        slug="maria",
        name="Maria",
        dialect="mysql",
        read_only=False,
        connection=mariadb_settings(reader=False),  # it writes, once approved
    )
    conversation = api.post("/api/conversations", {"title": "Shop"}, format="json").json()
    question = "Add a euro to Saturday's order, then show the orders"
    update = "UPDATE shop_orders SET total = total + 1 WHERE day = 'Sat'"
    scripted_model.load(
        script_for(
            question,
            sql("maria", update),
            sql("maria", "SELECT day, total FROM shop_orders ORDER BY id"),
            {"text": "Done."},
        )
    )
    started = api.post(
        "/api/sql/ask",
        {"datasource": "maria", "question": question, "conversation": conversation["id"]},
        format="json",
    ).json()
    assert started["conversation_id"] == conversation["id"]
    approval = wait_for(
        lambda: Approval.objects.filter(
            run_id=started["id"], status=Approval.Status.PENDING
        ).first(),
        what="the confirm of the write",
    )
    assert "this statement is not a read, so it may change data" in approval.prompt
    assert approval.prompt.endswith(
        f"it is an UPDATE statement; a read is one SELECT, WITH or EXPLAIN.\n{update}"
    )
    with mariadb_cursor() as cursor:
        cursor.execute("SELECT total FROM shop_orders WHERE day = 'Sat'")
        assert float(cursor.fetchone()[0]) == 20.5  # nothing before the approval
    decided = api.post(f"/api/approvals/{approval.id}/decision", {"approved": True}, format="json")
    assert decided.status_code == 200, decided.json()
    run = finished_run(api, started)
    assert run["status"] == "done", run["errors"]
    assert run["result"]["rows"] == [["Sat", 21.5], ["Sun", 31], ["Sun", 12.25]]
    assert run["result"]["columns"] == ["day", "total"]


def test_bad_questions_are_refused_and_leave_nothing_behind(api, other_api, db, shop_file):
    datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )
    datasource_made(
        slug="off",
        name="Off",
        dialect="sqlite",
        enabled=False,
        connection={"database": str(shop_file)},
    )
    mine = api.post("/api/conversations", {}, format="json").json()
    before = (Conversation.objects.count(), Run.objects.count())
    cases = [
        ({"datasource": "nope", "question": "q"}, 400, "unknown_datasource"),
        ({"datasource": "off", "question": "q"}, 400, "unknown_datasource"),
        ({"datasource": "shop", "question": "   "}, 400, "blank"),
        ({"datasource": "shop"}, 400, "required"),
        ({"datasource": "shop", "question": "q", "tools": ["shell"]}, 400, "unknown_field"),
    ]
    for body, status, code in cases:
        response = api.post("/api/sql/ask", body, format="json")
        assert (response.status_code, response.json()["code"]) == (status, code), (
            body,
            response.json(),
        )
    theirs = other_api.post(
        "/api/sql/ask",
        {"datasource": "shop", "question": "q", "conversation": mine["id"]},
        format="json",
    )
    assert theirs.status_code == 404
    assert (Conversation.objects.count(), Run.objects.count()) == before


# --- the offline demo ---------------------------------------------------------------------

DEMO_QUESTION = "average tip by day from the database"


@pytest.fixture
def demo_tips(tmp_path):
    """The offline demo's datasource as `make run` makes it, and the demo's script."""
    from secrets_vault.services import demo_datasource_ensure
    from tests.processes import ROOT

    return demo_datasource_ensure(
        csv_path=ROOT / "sample_data" / "tips.csv", db_path=tmp_path / "demo" / "tips.sqlite3"
    )


def tool_calls_of(api, run: dict) -> list[str]:
    """The names of the tools the run's agent called, in order (its stored events)."""
    events = api.get(f"/api/conversations/{run['conversation_id']}/events?after=0&limit=1000")
    return [
        e["event"]["data"]["name"]
        for e in events.json()["events"]
        if e["run_id"] == run["id"]
        and e["event"].get("type") == "notify"
        and e["event"].get("kind") == "tool"
    ]


def test_the_demo_answers_a_sql_question_with_the_sql_tools_it_may_use(
    api, celery_worker, scripted_model, demo_tips
):
    """`POST /api/sql/ask` on demo-tips with the demo's script: the query, its rows in the
    answer and the result, the statement at the end; no run_python (the run may not use
    it) and no chart to point at."""
    from tests.scripts import demo_script

    scripted_model.load(demo_script())
    started = api.post(
        "/api/sql/ask", {"datasource": "demo-tips", "question": DEMO_QUESTION}, format="json"
    )
    assert started.status_code == 202, started.json()
    run = finished_run(api, started.json())
    assert run["status"] == "done" and run["errors"] == [], run
    assert tool_calls_of(api, run) == ["run_sql"]
    result = run["result"]
    assert result["datasource"] == "demo-tips"
    assert result["columns"] == ["day", "bills", "average_tip"]
    assert result["rows"] == [
        ["Thur", 62, 2.77], ["Fri", 19, 2.73], ["Sat", 87, 2.99], ["Sun", 76, 3.26],
    ]  # fmt: skip
    answer = run["answer"]
    assert "| Sun | 76 | 3.26 |" in answer and "from the **demo-tips** database" in answer
    assert answer.endswith(f"```sql\n{result['sql']}\n```"), answer
    for word in ("run_python", "chart", "not allowed", "refused"):
        assert word not in answer.lower(), answer


def test_the_demo_asked_about_another_datasource_does_not_query_demo_tips(
    api, celery_worker, scripted_model, demo_tips, shop_file
):
    """With demo-tips on the server too (as after `make run`), a question about another
    datasource, by `POST /api/sql/ask` and then in the chat: the demo queries nothing and
    says it has no script for that datasource, naming it."""
    from tests.scripts import demo_script

    datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )
    scripted_model.load(demo_script())
    asked = {"datasource": "shop", "question": "What did the shop sell per day, from the database?"}
    started = api.post("/api/sql/ask", asked, format="json")
    assert started.status_code == 202, started.json()
    run = finished_run(api, started.json())
    assert run["status"] == "done" and run["errors"] == [], run
    assert tool_calls_of(api, run) == []
    # No query, so no rows; its lineage names the datasource and nothing read.
    assert run["result"] == {
        "lineage": {"datasources": ["shop"], "entries": [], "tables": [], "columns": []}
    }
    assert "scripted demo" in run["answer"] and "about **shop**" in run["answer"]
    assert "from the **demo-tips** database" not in run["answer"]

    # In the chat of that conversation (its datasource: shop), the demo's own question.
    conversation = f"/api/conversations/{run['conversation_id']}"
    chat = api.post(f"{conversation}/runs", {"prompt": DEMO_QUESTION}, format="json")
    assert chat.status_code == 202, chat.json()
    chat_run = finished_run(api, chat.json())
    assert chat_run["status"] == "done" and chat_run["errors"] == [], chat_run
    assert chat_run["datasources"] == ["shop"]
    assert tool_calls_of(api, chat_run) == []
    assert "gives it **shop**" in chat_run["answer"]
    assert "from the **demo-tips** database" not in chat_run["answer"]
