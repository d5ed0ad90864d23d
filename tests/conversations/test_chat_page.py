"""The web chat in a real browser: Debian's Chromium (Playwright) against a real web
process (uvicorn), a real Celery worker running paw-agent, and the project's scripted model."""

from __future__ import annotations

import hashlib
import io
import json
import re
from pathlib import Path

import openpyxl
import pytest

from accounts.models import User
from billing.models import Budget
from conversations.models import Approval, Conversation, ConversationFile, Run
from conversations.selectors.workspaces import workspace_path
from conversations.services.workspaces import workspace_ensure
from tests.conftest import PASSWORD, SCRIPTED_API_KEY
from tests.conversations.conftest import UPLOAD_LIMIT
from tests.live import wait_for
from tests.processes import ROOT
from tests.scripts import delete_script, demo_script, streaming

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]

TIPS = ROOT / "sample_data" / "tips.csv"
ASK_DEMO = "average tip by day, as a spreadsheet and a chart"


def assert_no_page_errors(session, allow: tuple[str, ...] = ()) -> None:
    """No script error, failed request or refused content in the page's console (but
    lines naming one of ``allow``)."""
    problems = [
        line
        for line in session.console
        if line.startswith(("pageerror", "error")) and not any(a in line for a in allow)
    ]
    assert problems == [], problems


@pytest.fixture
def alice(db) -> User:
    """A user with a monthly budget of a million tokens (shown by the usage badge)."""
    user = User.objects.create_user(username="alice", password=PASSWORD)
    Budget.objects.create(user=user, monthly_tokens=1_000_000)
    return user


@pytest.fixture
def chat(browser_session, alice):
    """A browser signed in as alice; ``chat.page`` is on a new conversation of hers."""
    browser_session.sign_in_as(alice)
    conversation = Conversation.objects.create(user=alice)
    page = browser_session.page
    page.goto(browser_session.url(f"/c/{conversation.id}/"))
    page.wait_for_selector(".connection[data-state=connected]")
    return browser_session


def conversation_of_page(page) -> Conversation:
    conversation_id = re.search(r"/c/([0-9a-f-]{36})/", page.url).group(1)
    return Conversation.objects.get(id=conversation_id)


def ask(page, text: str) -> None:
    page.get_by_label("Message to the agent").fill(text)
    page.get_by_label("Message to the agent").press("Enter")


def wait_until_idle(page) -> None:
    """The run ended: the Cancel button is gone and Send is usable again."""
    page.wait_for_selector("#cancel-run", state="hidden", timeout=60_000)
    page.wait_for_selector("#send:not([disabled])")


def test_sign_in_with_the_form_then_sign_out(browser_session, alice):
    page = browser_session.page
    page.goto(browser_session.url("/"))
    page.wait_for_url(re.compile(r"/accounts/login/"))  # the chat needs a session
    page.get_by_label("Username").fill("alice")
    page.get_by_label("Password").fill("not the password")
    page.get_by_role("button", name="Sign in").click()
    assert page.get_by_role("alert").is_visible()
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_selector("#prompt")
    assert page.locator(".sidebar-foot strong").inner_text() == "alice"
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r"/accounts/login/"))
    page.goto(browser_session.url("/"))
    page.wait_for_url(re.compile(r"/accounts/login/"))


def test_signing_out_in_one_tab_sends_the_other_tabs_to_the_sign_in_page(chat):
    page = chat.page
    other = chat.new_page()
    other.goto(page.url)
    other.wait_for_selector(".connection[data-state=connected]")
    page.get_by_role("button", name="Sign out").click()
    page.wait_for_url(re.compile(r"/accounts/login/"))
    # The other tab's socket is closed for the signed-out session: it goes to sign in,
    # and comes back to its conversation afterwards.
    other.wait_for_url(re.compile(r"/accounts/login/\?next=%2Fc%2F"))


def test_register_with_the_form_lands_in_the_chat(browser_session):
    page = browser_session.page
    page.goto(browser_session.url("/accounts/register/"))
    page.get_by_label("Username").fill("bob")
    page.get_by_label("Password", exact=True).fill("short")
    page.get_by_label("Password (again)").fill("short")
    page.get_by_role("button", name="Create the account").click()
    assert "too short" in page.locator(".field-error").first.inner_text()
    assert not User.objects.filter(username="bob").exists()
    page.get_by_label("Password", exact=True).fill(PASSWORD)
    page.get_by_label("Password (again)").fill(PASSWORD)
    page.get_by_role("button", name="Create the account").click()
    page.wait_for_selector("#prompt")
    assert page.locator(".sidebar-foot strong").inner_text() == "bob"
    assert User.objects.get(username="bob").check_password(PASSWORD)


def test_the_main_job_upload_ask_stream_tools_artifacts_download(chat, scripted_model):
    """tips.csv by the upload button → the demo question → streamed text, a run_python
    row, the answer table, summary.xlsx and chart.png listed, shown and downloadable."""
    scripted_model.load(demo_script())
    page = chat.page
    page.set_input_files("#file-input", str(TIPS))
    page.wait_for_selector("#file-chips .chip:has-text('tips.csv')")
    conversation = conversation_of_page(page)
    stored = ConversationFile.objects.get(conversation=conversation)
    assert stored.sha256 == hashlib.sha256(TIPS.read_bytes()).hexdigest()

    ask(page, ASK_DEMO)
    # The prompt shows at once; the agent's streamed text, then its tool row.
    page.wait_for_selector(f".prompt-bubble:has-text('{ASK_DEMO}')")
    page.wait_for_selector(".agent-text:has-text('load the data with pandas')")
    row = page.locator(".tool[data-tool=run_python]")
    row.wait_for()
    assert row.locator(".call").inner_text().startswith("run_python(code=")
    page.wait_for_selector(".tool[data-tool=run_python][data-state=ok]", timeout=60_000)
    answer = page.locator(".answer").last
    answer.wait_for(timeout=60_000)
    wait_until_idle(page)
    assert answer.locator("table").is_visible()  # rendered from Markdown on the server
    assert answer.locator("td", has_text="Sun").is_visible()
    assert "summary.xlsx" in answer.inner_text()
    assert page.locator(".run-footer .status").last.inner_text() == "Done"

    # The chart as a thumbnail that loaded, opening full size.
    thumbnail = page.locator(".artifact[data-path='chart.png'] img")
    thumbnail.wait_for(timeout=20_000)
    page.wait_for_function(  # a function, not an expression: the page's CSP forbids eval
        "() => document.querySelector(\".artifact[data-path='chart.png'] img\").naturalWidth > 100"
    )
    assert "inline=1" in page.locator(".artifact[data-path='chart.png'] a.thumbnail").get_attribute(
        "href"
    )

    # The spreadsheet downloads byte for byte and holds the averages.
    with page.expect_download() as info:
        page.locator(".artifact[data-path='summary.xlsx'] a.download").click()
    downloaded = Path(info.value.path()).read_bytes()
    assert info.value.suggested_filename == "summary.xlsx"
    assert downloaded == (workspace_path(conversation.id) / "summary.xlsx").read_bytes()
    sheet = openpyxl.load_workbook(io.BytesIO(downloaded)).active
    averages = {row[0]: row[1] for row in sheet.iter_rows(min_row=2, values_only=True)}
    assert averages == {"Thur": 2.77, "Fri": 2.73, "Sat": 2.99, "Sun": 3.26}
    # The usage badge: this run's tokens, and the month's against the budget.
    run = Run.objects.get(conversation=conversation)
    tokens = run.usage["input"] + run.usage["output"]
    assert tokens > 0
    badge = page.locator("#usage-badge")
    expected = f"This run: {tokens:,} · This month: {tokens:,} of 1,000,000 tokens"
    page.wait_for_function(
        "(text) => document.getElementById('usage-badge').textContent === text", arg=expected
    )
    assert badge.get_attribute("data-level") == ""
    assert_no_page_errors(chat)


def test_upload_by_drag_and_drop_keeps_the_bytes(chat):
    page = chat.page
    content = TIPS.read_bytes()
    drop = page.evaluate_handle(
        """(text) => {
            const data = new DataTransfer();
            data.items.add(new File([text], "dropped tips.csv", {type: "text/csv"}));
            data.items.add(new File(["a,b\\n1,2\\n"], "second.csv", {type: "text/csv"}));
            return data;
        }""",
        content.decode(),
    )
    page.dispatch_event("#main", "dragenter", {"dataTransfer": drop})
    assert page.locator("#drop-overlay").is_visible()
    page.dispatch_event("#main", "drop", {"dataTransfer": drop})
    page.wait_for_selector("#file-chips .chip:has-text('dropped tips.csv')")
    page.wait_for_selector("#file-chips .chip:has-text('second.csv')")
    assert page.locator("#drop-overlay").is_hidden()
    conversation = conversation_of_page(page)
    saved = workspace_path(conversation.id) / "dropped tips.csv"
    assert saved.read_bytes() == content


def test_a_file_over_the_limit_is_refused_with_a_clear_error(chat, tmp_path):
    page = chat.page
    limit = page.evaluate(
        "JSON.parse(document.getElementById('paw-config').textContent).maxUploadBytes"
    )
    assert limit == UPLOAD_LIMIT
    big = tmp_path / "big.bin"
    with big.open("wb") as handle:  # sparse: the size without writing the bytes
        handle.truncate(limit + 1)
    page.set_input_files("#file-input", str(big))
    error = page.locator(".upload[data-state=error]")
    error.wait_for()
    assert "too large" in error.inner_text()
    assert not ConversationFile.objects.exists()


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "declined"])
def test_a_gated_action_happens_only_when_approved_in_the_page(chat, scripted_model, approve):
    scripted_model.load(delete_script("old.csv"))
    page = chat.page
    conversation = conversation_of_page(page)
    target = workspace_ensure(conversation.id) / "old.csv"
    target.write_text("keep me unless approved")
    ask(page, "Delete old.csv")
    panel = page.get_by_role("alertdialog", name="Approval needed")
    panel.wait_for()
    assert "delete_file" in panel.locator(".approval-prompt").inner_text()
    assert "old.csv" in panel.locator(".approval-prompt").inner_text()
    # The one call the approval allows, as PAW will hold the runtime to it.
    assert panel.locator(".approval-call").inner_text() == ('delete_file {\n  "path": "old.csv"\n}')
    assert re.search(r"\d:\d\d left to decide", panel.locator(".approval-countdown").inner_text())
    assert target.exists()  # nothing happens before the decision
    panel.get_by_role("button", name="Approve" if approve else "Decline").click()
    panel.wait_for(state="detached")
    wait_until_idle(page)
    assert target.exists() is not approve
    approval = Approval.objects.get(conversation=conversation)
    assert approval.status == ("approved" if approve else "declined")
    assert approval.decided_by == "user" and approval.via == "websocket"
    step = page.locator(".step-approval")
    assert ("Approved by you" if approve else "Declined by you") in step.inner_text()
    if approve:
        page.wait_for_selector(".tool[data-tool=delete_file][data-state=ok]")
    else:
        page.locator(".answer", has_text="declined by the user").wait_for()


def asked_to_delete_old_csv(chat, scripted_model):
    """``(page, conversation)`` once the agent, asked to delete old.csv, waits for the
    person's approval on the chat's page."""
    scripted_model.load(delete_script("old.csv"))
    page = chat.page
    conversation = conversation_of_page(page)
    (workspace_ensure(conversation.id) / "old.csv").write_text("x")
    ask(page, "Delete old.csv")
    page.get_by_role("alertdialog", name="Approval needed").wait_for()
    return page, conversation


def test_an_approval_closes_when_answered_in_another_tab(chat, scripted_model):
    page, conversation = asked_to_delete_old_csv(chat, scripted_model)
    other = chat.new_page()
    other.goto(page.url)  # the pending approval is sent again to a new tab
    other.get_by_role("alertdialog", name="Approval needed").get_by_role(
        "button", name="Decline"
    ).click()
    page.get_by_role("alertdialog", name="Approval needed").wait_for(state="detached")
    wait_until_idle(page)
    assert (workspace_path(conversation.id) / "old.csv").exists()


def test_a_question_is_answered_with_an_option_button(chat, scripted_model):
    question = {"question": "Which chart?", "options": ["bar", "line"]}
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [
                {"tool_calls": [{"name": "ask_user", "arguments": question}]},
                "You picked: {{tool_result}}",
            ],
        }
    )
    page = chat.page
    ask(page, "Make a chart")
    panel = page.get_by_role("alertdialog", name="The agent has a question")
    panel.wait_for()
    assert panel.get_by_text("Which chart?").is_visible()
    panel.get_by_role("button", name="line").click()
    assert panel.get_by_role("button", name="line").get_attribute("aria-pressed") == "true"
    panel.get_by_role("button", name="Send the answer").click()
    panel.wait_for(state="detached")
    page.locator(".answer", has_text="You picked: the user answered: line").wait_for()
    assert "Answered by you: line" in page.locator(".step-approval").inner_text()


def test_the_agents_plan_is_shown_as_todos(chat, scripted_model):
    steps = [
        {"content": "Load the file", "status": "completed"},
        {"content": "Average the tips", "status": "in_progress"},
        {"content": "Draw the chart", "status": "pending"},
    ]
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [
                {"tool_calls": [{"name": "update_plan", "arguments": {"steps": steps}}]},
                "Working on it.",
            ],
        }
    )
    page = chat.page
    ask(page, "Plan it")
    plan = page.get_by_role("region", name="The agent's plan")
    plan.wait_for()
    items = plan.locator("li")
    assert items.count() == 3
    assert [items.nth(i).get_attribute("data-status") for i in range(3)] == [
        "completed", "in_progress", "pending",
    ]  # fmt: skip
    assert "Average the tips" in items.nth(1).inner_text()
    page.locator(".answer", has_text="Working on it.").wait_for()


def test_reload_mid_run_shows_the_whole_text_once(chat, scripted_model):
    numbers = " ".join(str(n) for n in range(1, 301))
    scripted_model.load(streaming(numbers, chunk_delay=0.012))
    page = chat.page
    ask(page, "Count to 300")
    page.wait_for_selector(".agent-text:has-text('20 21')")
    page.reload()  # mid-stream: the page replays what it missed, then goes live
    page.wait_for_selector(".connection[data-state=connected]")
    wait_until_idle(page)
    page.locator(".answer", has_text="300").wait_for()
    shown = page.locator(".answer").last.inner_text().split()
    assert shown == [str(n) for n in range(1, 301)]
    # The streamed text it repeats is hidden, not shown twice.
    visible = page.locator(".run").last.inner_text()
    assert visible.count(" 150 ") == 1
    run = Run.objects.get()
    assert run.status == "done" and run.answer.split() == shown


def test_a_dropped_connection_shows_reconnecting_then_resumes_without_a_gap(chat, scripted_model):
    numbers = " ".join(str(n) for n in range(1, 201))
    scripted_model.load(streaming(numbers, chunk_delay=0.015))
    page = chat.page
    sockets = []

    def through(ws) -> None:  # each websocket of the page, passed on to the server
        ws.connect_to_server()
        sockets.append(ws)

    page.route_web_socket(re.compile(r"/ws/conversations/"), through)
    page.reload()
    page.wait_for_selector(".connection[data-state=connected]")
    ask(page, "Count to 200")
    page.wait_for_selector(".agent-text:has-text('20 21')")
    sockets[-1].close()  # the network drops it mid-stream
    page.wait_for_selector(".connection[data-state=reconnecting]")
    assert page.locator("#connection").inner_text() == "Reconnecting…"
    page.wait_for_selector(".connection[data-state=connected]")
    assert len(sockets) == 2
    wait_until_idle(page)
    page.locator(".answer", has_text="200").wait_for()
    assert page.locator(".answer").last.inner_text().split() == numbers.split()
    # The streamed text (now behind the rendered answer) got every delta once, in order.
    streamed = page.locator(".run").last.locator(".agent-text").text_content()
    assert streamed.split() == numbers.split()


def test_cancel_stops_the_run(chat, scripted_model):
    scripted_model.load(streaming("word " * 400, chunk_delay=0.05))
    page = chat.page
    ask(page, "Talk for a long time")
    page.wait_for_selector(".agent-text:has-text('word word')")
    page.get_by_role("button", name="Cancel").click()
    wait_until_idle(page)
    assert page.locator(".run-footer .status").last.inner_text() == "Cancelled"
    assert wait_for(lambda: Run.objects.filter(status="cancelled").first(), what="cancelled")


def test_cancel_while_an_approval_waits_shows_the_text_once(chat, scripted_model):
    """The cancelled run's answer repeats its streamed text: it is shown once, live and
    after a reload."""
    page, conversation = asked_to_delete_old_csv(chat, scripted_model)
    page.get_by_role("button", name="Cancel").click()
    wait_until_idle(page)
    page.get_by_role("alertdialog", name="Approval needed").wait_for(state="detached")
    assert Run.objects.get().answer == "I will delete old.csv."
    for _ in range(2):
        step = page.locator(".step-approval")
        step.wait_for()
        assert "Withdrawn" in step.inner_text()
        page.wait_for_timeout(500)  # the rendered answer, if it were shown, has come by now
        assert page.locator(".run").last.inner_text().count("I will delete old.csv.") == 1
        page.reload()
        page.wait_for_selector(".connection[data-state=connected]")
    assert (workspace_path(conversation.id) / "old.csv").exists()


def test_sidebar_rename_delete_auto_approve_and_model_picker(chat, alice):
    page = chat.page
    conversation = conversation_of_page(page)
    # Auto-approve, remembered per conversation.
    page.get_by_label("Auto-approve risky actions").check()
    wait_for(lambda: Conversation.objects.get(id=conversation.id).auto_approve, what="saved")
    # The model picker: the providers, inactive ones greyed out; the choice is saved.
    picker = page.get_by_label("Model")
    assert page.locator("#model-picker optgroup[label^='OpenAI'][disabled]").count() == 1
    demo = page.locator("#model-picker optgroup[label^='Scripted demo'] option").first
    choice = demo.get_attribute("value")
    assert json.loads(choice)[0] == "demo"
    page.select_option("#model-picker", value=choice)
    wait_for(
        lambda: Conversation.objects.get(id=conversation.id).llm_provider == "demo", what="saved"
    )
    assert page.locator("#demo-banner").is_visible()
    page.reload()
    # The saved choice is selected again once the providers are listed.
    page.wait_for_function("(v) => document.getElementById('model-picker').value === v", arg=choice)
    assert picker.input_value() == choice
    assert page.get_by_label("Auto-approve risky actions").is_checked()
    # Rename.
    page.get_by_role("button", name="Rename this conversation").click()
    page.get_by_label("Title").fill("Quarterly tips")
    page.get_by_role("button", name="Rename", exact=True).click()
    page.locator("#conversation-list a[aria-current=page]", has_text="Quarterly tips").wait_for()
    assert Conversation.objects.get(id=conversation.id).title == "Quarterly tips"
    # Delete, after a confirmation that can be declined.
    page.get_by_role("button", name="Delete this conversation").click()
    page.get_by_role("button", name="Keep it").click()
    assert Conversation.objects.filter(id=conversation.id).exists()
    page.get_by_role("button", name="Delete this conversation").click()
    page.get_by_role("button", name="Delete", exact=True).click()
    page.wait_for_url(chat.url("/"))
    assert not Conversation.objects.filter(id=conversation.id).exists()


def test_the_first_message_starts_a_conversation_and_names_it(
    browser_session, alice, scripted_model
):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "responses": ["Hello there."]})
    browser_session.sign_in_as(alice)
    page = browser_session.page
    page.goto(browser_session.url("/"))
    page.get_by_role("button", name="New conversation").click()  # a blank page: nothing made
    assert not Conversation.objects.exists()
    ask(page, "Say hello")
    page.wait_for_url(re.compile(r"/c/[0-9a-f-]{36}/$"))
    page.locator(".answer", has_text="Hello there.").wait_for()
    page.locator("#conversation-list a[aria-current=page]", has_text="Say hello").wait_for()
    assert page.locator("#conversation-title").inner_text() == "Say hello"


def test_the_pages_forbid_inline_script_and_outside_sources(browser_session, alice):
    """The Content-Security-Policy the pages carry, and that the page works under it."""
    browser_session.sign_in_as(alice)
    page = browser_session.page
    response = page.goto(browser_session.url("/"))
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    page.wait_for_selector("#model-picker optgroup", state="attached")  # the modules ran
    blocked = page.evaluate(
        """() => new Promise((resolve) => {
            document.addEventListener("securitypolicyviolation", (e) => resolve(e.violatedDirective));
            const script = document.createElement("script");
            script.textContent = "window.injected = true";
            document.body.append(script);
            setTimeout(() => resolve(null), 1000);
        })"""
    )
    assert blocked == "script-src-elem"
    assert page.evaluate("window.injected") is None
    assert_no_page_errors(browser_session, allow=("Content Security Policy",))


def test_another_users_conversation_is_not_found(browser_session, alice, make_user):
    other = Conversation.objects.create(user=make_user("mallory"), title="private")
    browser_session.sign_in_as(alice)
    response = browser_session.page.goto(browser_session.url(f"/c/{other.id}/"))
    assert response.status == 404
    assert "private" not in browser_session.page.content()
