"""paw_client.client against a real PAW stack: personal tokens and password logins, typed
errors, uploads and downloads, a run's events exactly once across forced websocket drops,
approvals through the callback and as ApprovalRequired, a 402 as BudgetExhausted."""

from __future__ import annotations

import hashlib

import pytest

from billing.models import Budget
from conversations.models import Approval, RunEvent
from conversations.selectors.workspaces import workspace_path
from paw_client import (
    ApprovalRequired,
    AuthenticationFailed,
    BudgetExhausted,
    Client,
    InvalidRequest,
    NotFound,
    PermissionDenied,
    RateLimited,
    RunActive,
)
from secrets_vault.models import Datasource
from teams.models import Access
from tests.billing.ledger import ledger_event
from tests.clients.conftest import TIPS, Person
from tests.conftest import use_up_throttle
from tests.scripts import delete_script, demo_script, streaming

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def stored_events(run_id: str) -> list[tuple[int, dict]]:
    return list(
        RunEvent.objects.filter(run_id=run_id).order_by("cursor").values_list("cursor", "payload")
    )


def test_a_personal_token_and_typed_errors(stack, person, monkeypatch):
    monkeypatch.setenv("PAW_TOKEN", person.token)
    with Client(stack.base) as paw:  # the token comes from PAW_TOKEN
        assert paw.me().username == "ada"
        conversation = paw.new_conversation(title="Tips")
        assert paw.conversation(conversation.id).title == "Tips"
        assert [c.id for c in paw.conversations()] == [conversation.id]
        with pytest.raises(NotFound) as missing:
            paw.conversation("00000000-0000-0000-0000-000000000000")
        assert missing.value.code == "not_found" and missing.value.status == 404
        with pytest.raises(InvalidRequest) as bad:
            conversation.update(titel="typo")
        assert bad.value.code == "unknown_field" and "titel" in bad.value.fields
        assert conversation.datasources == []
        with pytest.raises(InvalidRequest) as no_source:
            conversation.update(datasources=["no-such-source"])
        assert no_source.value.code == "unknown_datasource"
        Datasource.objects.create(
            slug="shop", name="Shop", dialect="sqlite", connection={"database": "shop.db"},
            access=Access.EVERYONE,
        )  # fmt: skip
        assert conversation.update(datasources=["shop"]).datasources == ["shop"]
        assert paw.conversation(conversation.id).datasources == ["shop"]
        with pytest.raises(InvalidRequest) as unknown:
            conversation.ask("hi", provider="no-such-provider")
        assert unknown.value.code == "unknown_provider"
        with pytest.raises(PermissionDenied):
            paw.admin_secrets()  # not staff
        names = [p.name for p in paw.providers()]
        assert "default" in names
    with pytest.raises(AuthenticationFailed) as refused:
        Client(stack.base, token="paw_" + "x" * 43).me()
    assert refused.value.code == "token_not_valid"


def test_a_password_login_survives_a_revocation_by_logging_in_again(stack, person):
    paw = Client(stack.base, username=person.username, password=person.password)
    assert paw.me().username == "ada"
    first_refresh = paw.refresh_token
    # Every token of ada is revoked elsewhere: the next call gets a 401, the client's
    # refresh token is revoked too, so it signs in again with the password.
    Client(stack.base, token=person.token).logout()
    assert paw.me().username == "ada"
    assert paw.refresh_token != first_refresh
    with pytest.raises(AuthenticationFailed):
        Client(stack.base, token=person.token).me()  # the personal token went with them


def test_upload_with_progress_and_download_by_bytes_and_to_a_folder(stack, person, tmp_path):
    paw = Client(stack.base, token=person.token)
    conversation = paw.new_conversation()
    seen: list[tuple[int, int | None]] = []
    uploaded = conversation.upload(TIPS, progress=lambda done, total: seen.append((done, total)))
    content = TIPS.read_bytes()
    assert uploaded.name == "tips.csv" and uploaded.size == len(content)
    assert uploaded.sha256 == hashlib.sha256(content).hexdigest()
    assert seen[-1] == (len(content), len(content))
    named = conversation.upload(b"a,b\n1,2\n", name="données.csv")
    assert named.name == "données.csv"
    assert [f.name for f in conversation.files()] == ["tips.csv", "données.csv"]
    assert conversation.download_file(uploaded.id) == content
    saved = conversation.download_file(named.id, tmp_path)
    assert saved == tmp_path / "données.csv" and saved.read_bytes() == b"a,b\n1,2\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["données.csv"]  # no .part left
    conversation.delete_file(named.id)
    assert [f.name for f in conversation.files()] == ["tips.csv"]


def test_export_as_a_notebook_markdown_or_json(stack, person, scripted_model, tmp_path):
    import json

    import nbformat

    scripted_model.load(streaming("The average tip is 3.00.", chunk_delay=0.01))
    paw = Client(stack.base, token=person.token)
    conversation = paw.new_conversation(title="Tips")
    assert conversation.ask("Average tip?").wait().status == "done"
    notebook = nbformat.reads(conversation.export().decode(), as_version=4)  # ipynb first
    nbformat.validate(notebook)
    assert [c.source for c in notebook.cells[1:]] == [
        "### You\n\n> Average tip?",
        "The average tip is 3.00.",
    ]
    saved = paw.export(conversation.id, "md", tmp_path)
    assert saved == tmp_path / "Tips.md" and "> Average tip?" in saved.read_text()
    events = json.loads(conversation.export("json"))["events"]
    assert events[0]["event"]["type"] == "start" and events[-1]["event"]["type"] == "result"
    with pytest.raises(InvalidRequest) as bad:
        conversation.export("pdf")
    assert bad.value.code == "invalid_choice" and bad.value.status == 400
def test_files_and_artifacts_come_back_whole_across_their_pages(stack, person):
    """Both lists are paginated (at most 100 a page): the client follows ``next``."""
    paw = Client(stack.base, token=person.token)
    conversation = paw.new_conversation()
    for n in range(102):
        conversation.upload(b"a\n", name=f"up-{n:03}.csv")
    folder = workspace_path(conversation.id)
    for n in range(105):
        (folder / f"made-{n:03}.txt").write_text("x")
    assert [a.path for a in conversation.artifacts()] == [f"made-{n:03}.txt" for n in range(105)]
    assert [f.name for f in conversation.files()] == [f"up-{n:03}.csv" for n in range(102)]


def test_ask_wait_answer_usage_and_the_artifacts_the_run_made(
    stack, person, scripted_model, tmp_path
):
    scripted_model.load(demo_script())
    paw = Client(stack.base, token=person.token)
    conversation = paw.new_conversation()
    progress: list[str] = []
    run = conversation.ask(
        "average tip by day, as a spreadsheet and a chart",
        files=[TIPS],
        progress=lambda name, done, total: progress.append(name),
    )
    assert progress and set(progress) == {"tips.csv"}
    run.wait()
    assert run.status == "done", run.errors
    assert "summary.xlsx" in run.answer and "| Sun |" in run.answer
    assert run.usage.input > 0 and run.usage.output > 0
    assert sorted(a.path for a in run.artifacts) == ["chart.png", "summary.xlsx"]
    chart = conversation.download_artifact("chart.png", tmp_path)
    assert chart.read_bytes() == (workspace_path(conversation.id) / "chart.png").read_bytes()
    assert chart.read_bytes().startswith(b"\x89PNG")
    # A second run reads only its own events: it resumes after what the first one saw.
    scripted_model.load(streaming("Second answer.", chunk_delay=0.01))
    second = conversation.ask("and now?").wait()
    assert second.answer == "Second answer." and second.artifacts == []
    assert (
        conversation.event_cursor
        == RunEvent.objects.filter(conversation_id=conversation.id)
        .order_by("-cursor")
        .values_list("cursor", flat=True)
        .first()
    )


def test_events_arrive_exactly_once_in_order_across_forced_websocket_drops(
    stack, person, scripted_model, proxy
):
    """The connection is cut three times mid-run (the TCP connections broken, as a lost
    network does); the events read equal the run's stored events, one for one."""
    text = "".join(f"word{n:03d} " for n in range(150))
    scripted_model.load(streaming(text, chunk=8, chunk_delay=0.02))
    paw = Client(proxy.base, token=person.token)
    run = paw.new_conversation().ask("stream a long answer")
    read = []
    cuts_at = {10, 40, 80}
    for event in run.events():
        read.append(event)
        deltas = sum(1 for e in read if e.type == "delta")
        if event.type == "delta" and deltas in cuts_at:
            cuts_at.discard(deltas)
            proxy.cut()
    assert not cuts_at, "the run ended before every cut"
    assert read[-1].type == "result" and read[0].type == "start"
    assert [(e.cursor, e.event) for e in read] == stored_events(run.id)
    assert "".join(e.text for e in read) == text
    assert run._socket is None and proxy.connections >= 4  # reconnected after each cut
    assert run.status == "done" and run.answer.strip() == text.strip()


def test_a_revocation_mid_run_closes_the_socket_and_a_password_client_signs_in_again(
    stack, person, scripted_model
):
    """A logout everywhere closes the run's socket (4401); a client holding the password
    signs in again and reads on from its cursor: nothing lost, nothing doubled."""
    text = "".join(f"part{n:03d} " for n in range(100))
    scripted_model.load(streaming(text, chunk=8, chunk_delay=0.02))
    paw = Client(stack.base, username=person.username, password=person.password)
    run = paw.new_conversation().ask("stream")
    read, revoked, socket = [], False, None
    for event in run.events():
        read.append(event)
        socket = socket or run._socket
        if not revoked and sum(e.type == "delta" for e in read) == 20:
            Client(stack.base, username=person.username, password=person.password).logout()
            revoked = True
    assert revoked and run.status == "done"
    assert socket.connections == 2  # closed with 4401, reopened with the new token
    assert [(e.cursor, e.event) for e in read] == stored_events(run.id)
    assert paw.me().username == "ada"


def test_both_frame_shapes_are_accepted(stack):
    from paw_client.stream import frame_events

    one = {"type": "run.event", "cursor": 3, "run_id": "r", "event": {"type": "delta"}}
    many = {"type": "run.events", "events": [{"cursor": 4, "run_id": "r", "event": {}}, 5]}
    assert frame_events(one) == [one]
    assert frame_events(many) == [{"cursor": 4, "run_id": "r", "event": {}}]
    assert frame_events({"type": "run.status"}) == []


def test_an_approval_reaches_the_callback_and_is_decided_once(stack, person, scripted_model):
    scripted_model.load(delete_script("old.txt"))
    paw = Client(stack.base, token=person.token)
    conversation = paw.new_conversation()
    conversation.upload(b"bye", name="old.txt")
    asked = []

    def on_approval(request):
        asked.append(request)
        return True

    run = conversation.ask("delete old.txt", on_approval=on_approval).wait()
    assert run.status == "done", run.errors
    (request,) = asked
    assert request.kind == "confirm" and "old.txt" in request.prompt
    assert request.seconds_left() > 0
    assert not (workspace_path(conversation.id) / "old.txt").exists()
    approval = Approval.objects.get(id=request.id)
    assert approval.status == "approved" and approval.decided_by == "user"


def test_without_a_callback_an_approval_is_raised_and_answered_on_the_run(
    stack, person, scripted_model
):
    scripted_model.load(delete_script("keep.txt"))
    paw = Client(stack.base, token=person.token)
    conversation = paw.new_conversation()
    conversation.upload(b"stay", name="keep.txt")
    run = conversation.ask("delete keep.txt")
    read = []
    with pytest.raises(ApprovalRequired) as raised:
        for event in run.events():
            read.append(event)
    assert raised.value.approval.kind == "confirm"
    assert run.pending_approvals == [raised.value.approval]
    with pytest.raises(RunActive):
        conversation.ask("another one meanwhile")
    run.decline()
    read += list(run.events())
    assert run.status == "done"
    assert [(e.cursor, e.event) for e in read] == stored_events(run.id)
    assert (workspace_path(conversation.id) / "keep.txt").read_bytes() == b"stay"
    assert Approval.objects.get(id=raised.value.approval.id).status == "declined"


def test_a_used_up_budget_is_budget_exhausted_with_its_figures(stack, person):
    Budget.objects.create(user=person.user, monthly_tokens=1000)
    ledger_event(user=person.user, input_tokens=900, output_tokens=200)
    paw = Client(stack.base, token=person.token)
    conversation = paw.new_conversation()
    with pytest.raises(BudgetExhausted) as exhausted:
        conversation.ask("anything")
    assert exhausted.value.status == 402 and exhausted.value.code == "budget_exhausted"
    assert exhausted.value.used == 1100 and exhausted.value.limit == 1000
    assert exhausted.value.resets_at
    assert paw.usage().budget["used_this_month"] == 1100


def test_a_throttled_run_start_is_rate_limited_with_retry_after(stack, person):
    use_up_throttle("runs", f"user-{person.user.pk}", "30/min")  # the server's default
    paw = Client(stack.base, token=person.token)
    with pytest.raises(RateLimited) as limited:
        paw.new_conversation().ask("go")
    assert limited.value.status == 429 and limited.value.retry_after > 0


def test_a_run_that_ends_without_a_result_still_ends_the_stream(stack, person, scripted_model):
    """A run cancelled while the agent waits for an approval ends; events() ends with it."""
    scripted_model.load(delete_script("x.txt"))
    paw = Client(stack.base, token=person.token)
    conversation = paw.new_conversation()
    conversation.upload(b"x", name="x.txt")
    run = conversation.ask("delete x.txt")
    with pytest.raises(ApprovalRequired):
        list(run.events())
    run.cancel()
    read = list(run.events())
    assert run.status == "cancelled" and run.is_finished
    assert read == [] or all(e.run_id == run.id for e in read)
    assert Approval.objects.get(run_id=run.id).status != "pending"


def test_staff_tokens_reach_the_admin_api(stack, db):
    operator = Person("operator")
    operator.user.is_staff = True
    operator.user.save()
    paw = Client(stack.base, token=operator.token)
    assert isinstance(paw.admin_secrets(), list)
    assert paw.admin_datasources() == []


def test_the_data_agent_from_the_library_knowledge_refresh_and_sql_ask(
    stack, db, scripted_model, tmp_path
):
    """Staff teach a datasource (refresh schema, a doc, a checked example); a person asks a
    question of it with :meth:`Client.sql_ask` and gets the structured result."""
    import sqlite3

    from tests.conftest import SCRIPTED_API_KEY
    from tests.live import wait_for

    shop = tmp_path / "shop.sqlite3"
    with sqlite3.connect(shop) as database:
        database.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, day TEXT, total REAL)")
        database.executemany(
            "INSERT INTO orders (day, total) VALUES (?, ?)", [("Sat", 20.5), ("Sun", 31.0)]
        )
    operator = Person("operator")
    operator.user.is_staff = True
    operator.user.save()
    staff = Client(stack.base, token=operator.token)
    staff.admin_create_datasource(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop)},
        access="everyone",  # a new datasource is for staff only
    )  # fmt: skip
    staff.admin_refresh_schema("shop")
    schema = wait_for(
        lambda: staff.admin_knowledge("shop", kind="schema"), timeout=60, what="the schema"
    )
    assert any("orders" in entry["title"] for entry in schema)
    doc = staff.admin_add_knowledge("shop", kind="doc", title="Totals", text="Totals are in EUR.")
    assert staff.admin_update_knowledge("shop", doc["id"], text="In EUR.")["text"] == "In EUR."
    with pytest.raises(InvalidRequest) as failing:
        staff.admin_add_knowledge(
            "shop", kind="example", title="Bad", text="q", sql="SELECT nope FROM orders"
        )
    assert "nope" in failing.value.detail
    staff.admin_delete_knowledge("shop", doc["id"])
    with pytest.raises(NotFound):
        staff.admin_knowledge_entry("shop", doc["id"])

    ada = Client(stack.base, token=Person("ada").token)
    assert ada.datasource("shop")["slug"] == "shop"
    with pytest.raises(NotFound):
        ada.datasource("nope")
    question = "Sales per day?"
    query = "SELECT day, sum(total) AS total FROM orders GROUP BY day ORDER BY day"
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "rules": [
                {
                    "match": question.replace("?", r"\?"),
                    "responses": [
                        {
                            "tool_calls": [
                                {
                                    "name": "run_sql",
                                    "arguments": {"datasource": "shop", "query": query},
                                }
                            ]
                        },
                        {"text": "Sunday sold most."},
                    ],
                }
            ],
        }
    )
    run = ada.sql_ask("shop", question).wait()
    assert run.status == "done", run.errors
    assert run.kind == "sql" and run.answer == "Sunday sold most."
    assert run.result["sql"] == query
    assert run.result["columns"] == ["day", "total"]
    assert run.result["rows"] == [["Sat", 20.5], ["Sun", 31.0]]
    assert run.result["row_count"] == 2 and run.result["truncated"] is False
