"""The audit of data access end to end: a run of the real paw-agent (the scripted model
calling ``run_sql``) on a real SQLite datasource, through the real worker node; every
statement it sends is recorded by the node, once, with its user's teams, masked, judged
read or write, the write's approver, the outcome, rows and duration."""

from __future__ import annotations

import datetime
import re
import sqlite3
import time

import pytest
from django.contrib.auth.models import Group

from audit.models import SqlStatement
from conversations.models import Approval, Conversation, RunEvent
from tests.conftest import SCRIPTED_API_KEY, api_client_for
from tests.factories import datasource_made
from tests.live import wait_for
from tests.pgdatasource import pg_datasource_settings
from tests.secrets_vault.conftest import secret_value
from tests.secrets_vault.leak_scan import record_stored_runtime_output

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

READ = "SELECT day, total FROM orders WHERE day <> '{token}' ORDER BY id"
WRITE = "UPDATE orders SET total = total + 1 WHERE day = 'Sun'"
BROKEN = "SELECT no_such_column FROM orders"


def sql(datasource: str, query: str) -> dict:
    return {
        "tool_calls": [{"name": "run_sql", "arguments": {"datasource": datasource, "query": query}}]
    }


@pytest.fixture
def shop(tmp_path):
    """A writable SQLite datasource ``shop`` with three orders."""
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, day TEXT, total REAL)")
        db.executemany(
            "INSERT INTO orders (day, total) VALUES (?, ?)",
            [("Sat", 20.5), ("Sun", 31.0), ("Sun", 12.25)],
        )
    datasource_made(
        slug="shop", name="Shop", dialect="sqlite", read_only=False,
        connection={"database": str(path)},
    )  # fmt: skip
    return path


def run_with_approvals(api, scripted_model, *, prompt: str, steps: list, decide: list[bool]):
    """Start a run of ``prompt`` on ``shop`` (the scripted model answering with ``steps``),
    decide its confirms in turn as ``decide`` says (through the API, as its user), and
    return the finished run as the API shows it."""
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Shop",
            "rules": [{"match": re.escape(prompt), "responses": steps}],
        }
    )
    conversation = api.post("/api/conversations", {"title": "Shop"}, format="json").json()
    base = f"/api/conversations/{conversation['id']}"
    started = api.post(f"{base}/runs", {"prompt": prompt, "datasources": ["shop"]}, format="json")
    assert started.status_code == 202, started.json()
    run_id = started.json()["id"]
    for approved in decide:
        approval = wait_for(
            lambda: Approval.objects.filter(run_id=run_id, status=Approval.Status.PENDING).first(),
            what="the confirm of the write",
        )
        answer = api.post(
            f"/api/approvals/{approval.id}/decision", {"approved": approved}, format="json"
        )
        assert answer.status_code == 200, answer.json()
    return wait_for(
        lambda: (
            (run := api.get(f"{base}/runs/{run_id}").json())["status"]
            in ("done", "error", "cancelled")
            and run
        ),
        timeout=90,
        what="the run to end",
    )


def test_a_read_an_approved_write_and_a_failing_statement_are_each_recorded_once(
    api, user, make_user, celery_worker, scripted_model, shop
):
    analysts, finance = Group.objects.create(name="analysts"), Group.objects.create(name="finance")
    user.groups.add(analysts, finance)
    token = secret_value("audit-token")
    assert api.put("/api/secrets/MY_TOKEN", {"value": token}, format="json").status_code == 201
    prompt = "Audit me: the orders, a euro more on Sunday, and a broken query"
    before = datetime.datetime.now(datetime.UTC)
    run = run_with_approvals(
        api, scripted_model, prompt=prompt, decide=[True],
        steps=[sql("shop", READ.format(token=token)), sql("shop", WRITE), sql("shop", BROKEN),
               {"text": "Done."}],
    )  # fmt: skip
    assert run["status"] == "done", run["errors"]
    with sqlite3.connect(shop) as db:  # the write really happened, once
        assert db.execute("SELECT sum(total) FROM orders WHERE day = 'Sun'").fetchone() == (45.25,)

    rows = list(SqlStatement.objects.filter(run_id=run["id"]).order_by("ordinal"))
    # The reads were checked first (an EXPLAIN sent before each); the broken one did not
    # plan, so only its EXPLAIN was sent: check_failed.
    assert [(r.ordinal, r.kind, r.outcome, r.row_count, r.explained) for r in rows] == [
        (1, "read", "ok", 3, True),
        (2, "write", "ok", 2, False),
        (3, "read", "check_failed", None, True),
    ]
    read, write, broken = rows
    # Masked as every stored line is: the secret's value never reaches the audit (nor
    # any other stored column: the suite's secret scan reads them all).
    assert read.statement == READ.format(token="[secret:MY_TOKEN]")
    assert record_stored_runtime_output() > 0
    assert write.statement == WRITE and broken.statement == BROKEN
    approval = Approval.objects.get(run_id=run["id"])
    assert (write.approval_id, write.approved_by, write.approved_via) == (
        approval.id, "alice", "user",
    )  # fmt: skip
    assert (read.approval_id, read.approved_by, broken.approved_by) == (None, "", "")
    for row in rows:
        assert (row.user_id, row.username, row.datasource) == (user.pk, "alice", "shop")
        assert str(row.conversation_id) == run["conversation_id"]
        assert sorted(t.name for t in row.teams.all()) == ["analysts", "finance"]
        assert {t.team_id for t in row.teams.all()} == {analysts.pk, finance.pk}
        assert before <= row.time <= datetime.datetime.now(datetime.UTC)
        assert isinstance(row.duration_ms, int) and 0 <= row.duration_ms < 30_000
    assert read.time < write.time < broken.time
    # What paw-agent told the host of each statement it sent (``sql_run``).
    reported = [
        e.payload["data"]["sql_run"]
        for e in RunEvent.objects.filter(run_id=run["id"], kind="tool").order_by("cursor")
    ]
    assert [(r["row_count"], r["error"], r["explained"]) for r in reported] == [
        (3, None, True), (2, None, False), (None, "check_failed", True),
    ]  # fmt: skip
    assert [r["duration_ms"] for r in reported] == [r.duration_ms for r in rows]

    # The staff API shows the same rows, newest first; a user's own client may not.
    staff = api_client_for(make_user("root", is_staff=True))
    page = staff.get("/api/admin/audit", {"user": "alice"})
    assert page.status_code == 200, page.json()
    shown = page.json()["results"]
    assert [r["outcome"] for r in shown] == ["check_failed", "ok", "ok"]
    assert shown[1] == {
        "id": write.id,
        "time": write.time.isoformat().replace("+00:00", "Z"),
        "user": "alice",
        "user_id": user.pk,
        "teams": [{"id": analysts.pk, "name": "analysts"}, {"id": finance.pk, "name": "finance"}],
        "datasource": "shop",
        "conversation_id": run["conversation_id"],
        "run_id": run["id"],
        "statement": WRITE,
        "kind": "write",
        "approved_by": "alice",
        "approved_via": "user",
        "approval_id": str(approval.id),
        "outcome": "ok",
        "explained": False,
        "row_count": 2,
        "duration_ms": write.duration_ms,
    }
    assert token not in page.content.decode()
    assert api.get("/api/admin/audit").status_code == 403

    # Deleting the conversation leaves its audit.
    assert api.delete(f"/api/conversations/{run['conversation_id']}").status_code == 204
    assert not Conversation.objects.filter(id=run["conversation_id"]).exists()
    assert SqlStatement.objects.filter(run_id=run["id"]).count() == 3


def test_a_declined_write_is_recorded_as_declined_without_an_approver(
    api, celery_worker, scripted_model, shop
):
    prompt = "Audit me: try a write and let me decline it"
    run = run_with_approvals(
        api, scripted_model, prompt=prompt, decide=[False],
        steps=[sql("shop", WRITE), {"text": "Not done."}],
    )  # fmt: skip
    assert run["status"] == "done", run["errors"]
    [row] = SqlStatement.objects.filter(run_id=run["id"])
    approval = Approval.objects.get(run_id=run["id"])
    assert (row.kind, row.outcome, row.row_count, row.duration_ms) == (
        "write",
        "declined",
        None,
        None,
    )
    assert (row.approval_id, row.approved_by, row.approved_via) == (approval.id, "", "")
    with sqlite3.connect(shop) as db:
        assert db.execute("SELECT sum(total) FROM orders WHERE day = 'Sun'").fetchone() == (43.25,)


def test_an_auto_approved_write_names_the_conversations_owner(
    api, celery_worker, scripted_model, shop
):
    prompt = "Audit me: a write the conversation approves by itself"
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Shop",
            "rules": [
                {"match": re.escape(prompt), "responses": [sql("shop", WRITE), {"text": "Ok."}]}
            ],
        }
    )
    conversation = api.post(
        "/api/conversations", {"title": "Shop", "auto_approve": True}, format="json"
    ).json()
    base = f"/api/conversations/{conversation['id']}"
    run_id = api.post(
        f"{base}/runs", {"prompt": prompt, "datasources": ["shop"]}, format="json"
    ).json()["id"]
    run = wait_for(
        lambda: (r := api.get(f"{base}/runs/{run_id}").json())["status"] == "done" and r,
        timeout=90,
        what="the run to end",
    )
    [row] = SqlStatement.objects.filter(run_id=run["id"])
    assert (row.kind, row.outcome, row.row_count) == ("write", "ok", 2)
    assert (row.approved_by, row.approved_via) == ("alice", "auto")


def test_a_statement_cut_short_by_a_cancel_is_recorded_interrupted(
    api, celery_worker, scripted_model
):
    datasource_made(slug="pg", name="PG", dialect="postgresql", connection=pg_datasource_settings())
    prompt = "Audit me: count to three hundred million"
    slow = "SELECT count(*) FROM generate_series(1, 300000000) AS g"
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Count",
            "rules": [
                {"match": re.escape(prompt), "responses": [sql("pg", slow), {"text": "Hm."}]}
            ],
        }
    )
    conversation = api.post("/api/conversations", {"title": "Count"}, format="json").json()
    base = f"/api/conversations/{conversation['id']}"
    run_id = api.post(
        f"{base}/runs", {"prompt": prompt, "datasources": ["pg"]}, format="json"
    ).json()["id"]
    wait_for(
        lambda: RunEvent.objects.filter(run_id=run_id, kind="tool_running").exists(),
        what="the statement to be sent",
    )
    time.sleep(0.5)
    assert api.post(f"{base}/runs/{run_id}/cancel").status_code == 202
    run = wait_for(
        lambda: (
            (r := api.get(f"{base}/runs/{run_id}").json())["status"]
            in ("done", "error", "cancelled")
            and r
        ),
        timeout=60,
        what="the run to end",
    )
    assert run["status"] == "cancelled", run["errors"]
    [row] = SqlStatement.objects.filter(run_id=run_id)
    assert (row.statement, row.kind, row.outcome, row.row_count) == (
        slow,
        "read",
        "interrupted",
        None,
    )


def test_a_write_refused_on_a_read_only_datasource_is_recorded_refused(
    api, celery_worker, scripted_model, tmp_path
):
    path = tmp_path / "ro.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    datasource_made(
        slug="ro", name="Read only", dialect="sqlite", read_only=True,
        connection={"database": str(path)},
    )  # fmt: skip
    prompt = "Audit me: delete the orders of a read-only datasource"
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Ro",
            "rules": [
                {
                    "match": re.escape(prompt),
                    "responses": [sql("ro", "DELETE FROM orders"), {"text": "No."}],
                }
            ],
        }
    )
    conversation = api.post("/api/conversations", {"title": "Ro"}, format="json").json()
    base = f"/api/conversations/{conversation['id']}"
    run_id = api.post(
        f"{base}/runs", {"prompt": prompt, "datasources": ["ro"]}, format="json"
    ).json()["id"]
    run = wait_for(
        lambda: (r := api.get(f"{base}/runs/{run_id}").json())["status"] in ("done", "error") and r,
        timeout=60,
        what="the run to end",
    )
    assert run["status"] == "done", run["errors"]
    [row] = SqlStatement.objects.filter(run_id=run_id)
    assert (row.kind, row.outcome, row.row_count, row.duration_ms, row.approval_id) == (
        "write", "refused", None, None, None,
    )  # fmt: skip


def test_statements_the_check_sent_back_are_recorded_check_failed_and_their_rows_say_why(
    api, celery_worker, scripted_model, shop
):
    """paw-agent's check before running: a statement that does not parse never reaches
    the database (``check_failed``, not explained); one that does not plan reaches it only
    as its EXPLAIN (``check_failed``, explained); the fix runs, unchecked (``ok``: the
    two sent back used the run's ``--sql-retries``). The tool rows the chat replays (the
    conversation's events) carry what the check said."""
    unparsed = "SELECT day FORM orders"
    fixed = "SELECT day, total FROM orders ORDER BY id"
    run = run_with_approvals(
        api, scripted_model, prompt="Audit me: two wrong tries, then the right one", decide=[],
        steps=[sql("shop", unparsed), sql("shop", BROKEN), sql("shop", fixed), {"text": "Ok."}],
    )  # fmt: skip
    assert run["status"] == "done", run["errors"]
    rows = list(SqlStatement.objects.filter(run_id=run["id"]).order_by("ordinal"))
    assert [(r.statement, r.outcome, r.explained, r.row_count) for r in rows] == [
        (unparsed, "check_failed", False, None),
        (BROKEN, "check_failed", True, None),
        (fixed, "ok", False, 3),  # the two sent back used the run's retries: unchecked
    ]
    assert rows[0].duration_ms is None and isinstance(rows[1].duration_ms, int)
    events = api.get(f"/api/conversations/{run['conversation_id']}/events").json()["events"]
    tools = [e["event"]["data"] for e in events if e["kind"] == "tool"]
    assert [(t["ok"], t["summary"]) for t in tools] == [
        (False, "checked: does not parse near orders"),
        (False, "checked: unknown column no_such_column"),
        (True, "(3 rows)"),
    ]
    assert [
        {k: t["sql_check"][k] for k in ("ok", "code", "name", "message", "left")} for t in tools
    ] == [
        {"ok": False, "code": "unparsed", "name": "orders", "message": "does not parse near orders",
         "left": 1},
        {"ok": False, "code": "unknown_column", "name": "no_such_column",
         "message": "unknown column no_such_column", "left": 0},
        {"ok": None, "code": "retries_used", "name": "",
         "message": "not checked: 2 statements were sent back already", "left": 0},
    ]  # fmt: skip
    with sqlite3.connect(shop) as db:  # nothing was changed: these were reads
        assert db.execute("SELECT sum(total) FROM orders").fetchone() == (63.75,)
