"""Runs with datasources through the real worker, the real paw-agent under the default
isolation (bubblewrap when installed) and the scripted model: ``run_sql`` on the test
PostgreSQL database and on a real SQLite file bound into the jail, a read-only datasource
that PostgreSQL itself keeps read-only, and a user secret the agent prints, which comes
back out of PAW only as ``[secret:NAME]``."""

from __future__ import annotations

import json
import re
import secrets as pysecrets
import shutil
import sqlite3

import pytest
from django.test import Client

from conversations.models import Run, RunEvent
from sandboxes.models import Sandbox
from secrets_vault.services import secret_set
from tests.conftest import SCRIPTED_API_KEY
from tests.factories import datasource_made
from tests.live import wait_for
from tests.pgdatasource import pg_datasource_connect, pg_datasource_settings
from tests.secrets_vault.conftest import secret_value
from tests.secrets_vault.leaky_urls import LEAKY_URLCONF

STOCK_QUERY = "SELECT item, qty FROM paw_datasource_run_stock ORDER BY id"
STOCK_INSERT = "INSERT INTO paw_datasource_run_stock VALUES (3, 'eraser', 1)"


@pytest.fixture
def shop_sqlite(tmp_path):
    """A real SQLite file with a table ``orders`` (two rows), outside the workspace."""
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, item TEXT, total REAL)")
        db.executemany(
            "INSERT INTO orders (item, total) VALUES (?, ?)", [("lamp", 12.5), ("desk", 99.0)]
        )
    return path


@pytest.fixture
def scratch_table():
    """A scratch table ``paw_datasource_run_stock`` (two rows) in the datasource test
    database (never PAW's own), committed so the sandbox sees it, dropped afterwards."""
    with pg_datasource_connect() as cursor:
        cursor.execute("DROP TABLE IF EXISTS paw_datasource_run_stock")
        cursor.execute(
            "CREATE TABLE paw_datasource_run_stock (id int PRIMARY KEY, item text, qty int)"
        )
        cursor.execute(
            "INSERT INTO paw_datasource_run_stock VALUES (1, 'pencil', 40), (2, 'ink', 7)"
        )
    yield
    with pg_datasource_connect() as cursor:
        cursor.execute("DROP TABLE IF EXISTS paw_datasource_run_stock")


def postgres_settings(password_placeholder: str) -> dict:
    """Connection settings of the test database, the password as a placeholder."""
    return {**pg_datasource_settings(), "password": password_placeholder}


def tool_messages(scripted_model, prompt: str) -> list[str]:
    """The tool results paw-agent sent back to the model in the latest request of the
    turn that began with ``prompt`` (the shared model server also logs other tests')."""
    ours = [
        body
        for body in scripted_model.requests
        if body.get("tools") and any(m.get("content") == prompt for m in body["messages"])
    ]
    assert ours, "the model never saw the prompt"
    return [m["content"] for m in ours[-1]["messages"] if m.get("role") == "tool"]


def run_sql(datasource: str, query: str) -> dict:
    """A scripted ``run_sql`` tool call."""
    return {"name": "run_sql", "arguments": {"datasource": datasource, "query": query}}


def run_through_the_api(api, scripted_model, worker, *, prompt, datasources, steps, **fields):
    """Start a run in a new conversation (``fields`` set on it first) through
    ``POST /api/conversations/{id}/runs`` with ``datasources``, the scripted model
    answering the prompt with ``steps``; the finished run as the API shows it."""
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Shops",
            "rules": [{"match": re.escape(prompt), "when_tool": "run_sql", "responses": steps}],
        }
    )
    conversation = api.post("/api/conversations", {"title": "Shops", **fields}, format="json")
    assert conversation.status_code == 201, conversation.json()
    base = f"/api/conversations/{conversation.json()['id']}"
    started = api.post(
        f"{base}/runs", {"prompt": prompt, "datasources": datasources}, format="json"
    )
    assert started.status_code == 202, started.json()
    assert started.json()["datasources"] == datasources
    run = wait_for(
        lambda: (
            (r := api.get(f"{base}/runs/{started.json()['id']}").json())["status"]
            in ("done", "error", "cancelled")
            and r
        ),
        timeout=90,
        what="the run to end",
    )
    assert run["status"] == "done", (run["errors"], worker.output()[-4000:])
    return run


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_queries_the_test_postgresql_database_and_a_printed_secret_is_masked(
    api, celery_worker, scripted_model, scratch_table, shop_sqlite
):
    pg_password = secret_value("pg-password")
    # PostgreSQL trusts loopback here, so any password connects: it must still travel
    # only as a placeholder and never come back out.
    secret_set(name="SHOP_PG_PASSWORD", value=pg_password)
    datasource_made(
        slug="shop_pg", name="Shop PostgreSQL", dialect="postgresql",
        description="Stock (PostgreSQL)", connection=postgres_settings("{secret:SHOP_PG_PASSWORD}"),
    )  # fmt: skip
    datasource_made(
        slug="shop-file", name="Shop file", dialect="sqlite", description="Orders (SQLite)",
        connection={"database": str(shop_sqlite)},
    )  # fmt: skip
    token = secret_value("my-token")
    assert api.put("/api/secrets/MY_TOKEN", {"value": token}, format="json").status_code == 201
    prompt = "Show the stock and my token."
    print_token = {"name": "run_python", "arguments": {"code": (
        "import os\n"
        f"print('sqlite file in the jail:', os.path.exists({str(shop_sqlite)!r}))\n"
        "print('token:', os.environ['MY_TOKEN'])"
    )}}  # fmt: skip
    run = run_through_the_api(
        api, scripted_model, celery_worker, prompt=prompt, datasources=["shop-file", "shop_pg"],
        steps=[
            {"tool_calls": [run_sql("shop_pg", STOCK_QUERY)]},
            {"tool_calls": [print_token]},
            {"text": "Here it is. {{tool_result}}"},
        ],
    )  # fmt: skip

    pg_result, python_result = tool_messages(scripted_model, prompt)
    assert "| item | qty |" in pg_result
    assert "| pencil | 40 |" in pg_result and "| ink | 7 |" in pg_result
    assert "(2 rows)" in pg_result
    assert token in python_result, "the agent's tool really saw the user's secret"
    assert "sqlite file in the jail: True" in python_result
    sandbox = Sandbox.objects.get(conversation_id=run["conversation_id"])
    assert ("bwrap" in sandbox.command.split()) == bool(shutil.which("bwrap")), sandbox.command

    # The agent printed the secret and answered with it: PAW shows only its name.
    assert "[secret:MY_TOKEN]" in run["answer"] and token not in run["answer"]
    stored_events = RunEvent.objects.filter(run_id=run["id"]).order_by("cursor")
    stored = json.dumps([e.payload for e in stored_events])
    assert "[secret:MY_TOKEN]" in stored
    tools = [e.payload["data"] for e in stored_events if e.kind == "tool"]
    assert [(t["name"], t["ok"]) for t in tools] == [("run_sql", True), ("run_python", True)]
    # The output shown to people (tool_output) is masked like every event.
    assert "token: [secret:MY_TOKEN]" in tools[1]["output"]["stdout"]
    conversation_id = run["conversation_id"]
    events = api.get(f"/api/conversations/{conversation_id}/events", {"after": 0, "limit": 500})
    assert "[secret:MY_TOKEN]" in events.content.decode()
    texts = {
        "stored events": stored,
        "stored answer": Run.objects.get(id=run["id"]).answer,
        "run API": json.dumps(run),
        "events API": events.content.decode(),
        "worker log": celery_worker.output(),
    }
    for where, text in texts.items():
        assert token not in text, f"the user's secret in the {where}"
        assert pg_password not in text, f"the datasource password in the {where}"


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_run_queries_a_sqlite_datasource_file_inside_the_jail(
    api, celery_worker, scripted_model, shop_sqlite
):
    datasource_made(
        slug="shop-file", name="Shop file", dialect="sqlite", description="Orders (SQLite)",
        connection={"database": str(shop_sqlite)},
    )  # fmt: skip
    prompt = "Which orders are in the shop file?"
    run = run_through_the_api(
        api, scripted_model, celery_worker, prompt=prompt, datasources=["shop-file"],
        steps=[
            {"tool_calls": [run_sql("shop-file", "SELECT item, total FROM orders ORDER BY id")]},
            {"text": "Orders: {{tool_result}}"},
        ],
    )  # fmt: skip
    [sqlite_result] = tool_messages(scripted_model, prompt)
    assert "| lamp | 12.5 |" in sqlite_result and "| desk | 99.0 |" in sqlite_result
    assert "| lamp | 12.5 |" in run["answer"] and "(2 rows)" in run["answer"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_write_to_a_read_only_postgresql_datasource_never_happens(
    api, celery_worker, scripted_model, scratch_table
):
    datasource_made(
        slug="stock", name="Stock", dialect="postgresql", read_only=True,
        connection=postgres_settings("{secret:STOCK_PG_PASSWORD}"),
    )  # fmt: skip
    secret_set(name="STOCK_PG_PASSWORD", value=secret_value("stock-pw"))
    prompt = "Add an eraser to the stock."
    run = run_through_the_api(
        api, scripted_model, celery_worker, prompt=prompt, datasources=["stock"],
        steps=[
            {"tool_calls": [run_sql("stock", STOCK_INSERT)]},
            {"text": "{{tool_result}}"},
        ],
        auto_approve=True,  # even an approved write: the datasource is read-only
    )  # fmt: skip
    with pg_datasource_connect() as cursor:
        count = cursor.execute("SELECT count(*) FROM paw_datasource_run_stock").fetchone()
        assert count[0] == 2, f"the write went through: {run['answer']}"
    assert "datasource stock is read-only" in run["answer"]


@pytest.mark.django_db
def test_the_secret_scan_is_active_outside_the_vault_tests(request, settings):
    """The suite-wide scan (tests/conftest.py) runs here too, and catches a leak."""
    assert "secret_scan" in request.fixturenames, "autouse for every test of the suite"
    scan = request.getfixturevalue("secret_scan")
    settings.ROOT_URLCONF = LEAKY_URLCONF
    value = f"stored-{pysecrets.token_hex(12)}"  # known only by being stored
    secret_set(name="LEAKED_HERE", value=value)
    Client().get("/leak/json/LEAKED_HERE/")
    assert [(leak.where, leak.value) for leak in scan.take()] == [
        ("GET /leak/json/LEAKED_HERE/ (200)", value)
    ]
