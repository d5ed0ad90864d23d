"""Sharing a conversation from the chat page, in a real browser (Debian's Chromium, a real
web process and worker running paw-agent, the scripted model's offline demo): alice shares
with her team, bob (of the team) sees the transcript, its chart and files read-only, carol
(of another team) gets a 404, bob forks it and the fork's agent remembers the shared
answer, and once alice stops sharing the link is gone."""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from django.contrib.auth.models import Group

from accounts.models import User
from conversations.models import Conversation, ConversationFile, Share
from tests.conftest import PASSWORD
from tests.conversations.conftest import BrowserSession, keep_failure_artifacts
from tests.conversations.test_chat_page import (
    ASK_DEMO,
    TIPS,
    alice,
    ask,
    assert_no_page_errors,
    conversation_of_page,
    wait_until_idle,
)
from tests.scripts import demo_script

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]
__all__ = ["alice"]  # fixtures

FOLLOW_UP = "which day had the highest tip, from that table?"


@pytest.fixture
def people(alice) -> dict[str, User]:
    """alice and bob in the team analysts, carol in finance."""
    bob = User.objects.create_user(username="bob", password=PASSWORD)
    carol = User.objects.create_user(username="carol", password=PASSWORD)
    Group.objects.create(name="analysts").user_set.add(alice, bob)
    Group.objects.create(name="finance").user_set.add(carol)
    return {"alice": alice, "bob": bob, "carol": carol}


@pytest.fixture
def browser_of(request, chromium, chat_server) -> Iterator:
    """``browser_of(user)``: another browser context signed in as ``user`` (its pages'
    screenshots and console kept when the test fails)."""
    sessions: list[BrowserSession] = []

    def open_for(user: User) -> BrowserSession:
        context = chromium.new_context(viewport={"width": 1280, "height": 900})
        session = BrowserSession(context, chat_server)
        session.sign_in_as(user)
        sessions.append(session)
        return session

    yield open_for
    for session in sessions:
        keep_failure_artifacts(request, session.context, session, {})
        session.context.close()


def test_share_with_a_team_view_refuse_fork_and_stop(
    browser_session, browser_of, people, scripted_model
):
    scripted_model.load(demo_script())
    browser_session.sign_in_as(people["alice"])
    page = browser_session.page
    page.goto(browser_session.url("/"))
    page.wait_for_selector("#prompt")
    assert page.locator("#share-conversation").is_hidden()  # nothing to share yet
    page.set_input_files("#file-input", str(TIPS))
    page.wait_for_selector("#file-chips .chip:has-text('tips.csv')")
    ask(page, ASK_DEMO)
    page.wait_for_selector(".tool[data-tool=run_python][data-state=ok]", timeout=60_000)
    page.locator(".answer").last.wait_for(timeout=60_000)
    wait_until_idle(page)
    conversation = conversation_of_page(page)

    # Share with the team analysts.
    page.get_by_role("button", name="Share", exact=True).click()
    dialog = page.locator("#share-dialog")
    dialog.get_by_label("Members of my teams").check()
    dialog.get_by_label("analysts").check()
    dialog.get_by_role("button", name="Create link").click()
    item = dialog.locator(".share-item")
    item.wait_for()
    assert item.locator(".share-audience").inner_text() == "Members of analysts"
    link = item.get_by_label("Link to this share").input_value()
    share = Share.objects.get(conversation=conversation)
    assert link == browser_session.url(f"/s/{share.id}/")
    assert list(share.teams.values_list("name", flat=True)) == ["analysts"]

    # bob, of the team, sees it read-only: the transcript, its tool row, chart and files.
    bob = browser_of(people["bob"])
    shared = bob.page
    assert shared.goto(link).status == 200
    shared.wait_for_selector(".answer")
    shared.wait_for_selector("#transcript[aria-busy=false]")
    assert shared.locator("#conversation-title").inner_text() == conversation.title
    assert "Shared by alice" in shared.locator("#share-note").inner_text()
    assert shared.locator(".prompt-bubble").first.inner_text().endswith(ASK_DEMO)
    assert shared.locator(".tool[data-tool=run_python][data-state=ok]").count() == 1
    chart = shared.locator(".tool-media img").first
    chart.wait_for()
    shared.wait_for_function(
        "img => img.complete && img.naturalWidth > 0", arg=chart.element_handle()
    )
    assert f"/api/shares/{share.id}/files/" in chart.get_attribute("src")
    uploads = shared.locator("#share-uploads")
    assert uploads.get_by_role("link", name="tips.csv").count() == 1
    assert shared.locator("#share-artifacts").get_by_role("link", name="chart.png").count() == 1
    assert shared.locator("#prompt, #composer, #approvals").count() == 0  # nothing to run
    assert_no_page_errors(bob)

    # carol, of another team: as if there were no such share.
    carol = browser_of(people["carol"])
    refused = carol.page.goto(link)
    assert refused.status == 404
    assert conversation.title not in carol.page.content()

    # bob forks it: his own conversation, whose agent remembers the shared answer's table.
    shared.get_by_role("button", name="Fork").click()
    shared.wait_for_url(re.compile(r"/c/[0-9a-f-]{36}/$"))
    shared.wait_for_selector(".connection[data-state=connected]")
    fork = conversation_of_page(shared)
    assert fork.user == people["bob"] and fork.id != conversation.id
    shared.wait_for_selector("#file-chips .chip:has-text('tips.csv')")
    shared.wait_for_selector("#artifact-list :text('chart.png')")
    assert ConversationFile.objects.filter(conversation=fork, name="tips.csv").exists()
    assert shared.locator(".tool[data-tool=run_python]").count() == 1
    ask(shared, FOLLOW_UP)
    shared.locator(".run").nth(1).locator(".answer").wait_for(timeout=60_000)
    answer = shared.locator(".run").nth(1).locator(".answer").inner_text()
    assert "Sun had the highest average tip" in answer, answer
    assert Conversation.objects.filter(user=people["alice"]).count() == 1  # hers: untouched

    # Shared by me (linked from the dialog): alice updates the share to the conversation now.
    dialog.get_by_role("link", name="Shared by me").click()
    page.wait_for_url("**/shares/")
    mine = page.locator("#shares .share-item")
    mine.wait_for()
    assert mine.get_by_role("link", name=conversation.title).count() == 1
    assert mine.get_by_label("Link to this share").input_value() == link
    mine.get_by_role("button", name="Update to now").click()
    page.wait_for_function(
        f"() => !document.querySelector('[data-share-id=\"{share.id}\"] button:disabled')"
    )
    share.refresh_from_db()
    assert share.snapshot == 2

    # alice stops sharing from the conversation's Share dialog: the link stops at once.
    page.goto(browser_session.url(f"/c/{conversation.id}/"))
    page.get_by_role("button", name="Share", exact=True).click()
    item = dialog.locator(".share-item")
    item.get_by_role("button", name="Stop sharing").click()
    dialog.locator("#share-list-empty").wait_for()
    assert not Share.objects.filter(id=share.id).exists()
    assert shared.goto(link).status == 404
    assert_no_page_errors(browser_session)


def test_a_shared_sql_answer_shows_its_table_and_an_interactive_chart(
    tmp_path, browser_session, browser_of, people, scripted_model
):
    """The demo's SQL question on the demo datasource, shared with everyone signed in:
    carol sees the run_sql row's statement and rows, and the Plotly chart drawn by PAW's
    plotly.js (hovering a bar shows its value), from the share's own files."""
    from secrets_vault.services import demo_datasource_ensure

    demo_datasource_ensure(csv_path=TIPS, db_path=tmp_path / "demo" / "tips.sqlite3")
    scripted_model.load(demo_script())
    browser_session.sign_in_as(people["alice"])
    page = browser_session.page
    page.goto(browser_session.url("/"))
    picker = page.locator("#datasource-picker")
    picker.locator("summary").click()
    picker.get_by_label("Tips (demo)").check()
    page.wait_for_selector("#share-conversation", state="visible")  # the tick made it
    picker.locator("summary").click()
    ask(page, "average tip by day from the database")
    page.locator(".answer", has_text="from the demo-tips database").wait_for(timeout=90_000)
    wait_until_idle(page)
    page.get_by_role("button", name="Share", exact=True).click()
    dialog = page.locator("#share-dialog")
    dialog.get_by_label("Everyone signed in to PAW").check()
    dialog.get_by_label("The link works").select_option(label="for 7 days")
    dialog.get_by_role("button", name="Create link").click()
    link = dialog.get_by_label("Link to this share").input_value()
    assert "works until" in dialog.locator(".share-item").inner_text()

    carol = browser_of(people["carol"])
    shared = carol.page
    assert shared.goto(link).status == 200
    assert "the link works until" in shared.locator("#share-note").inner_text()
    sql_row = shared.locator(".tool[data-tool=run_sql]")
    sql_row.locator("summary").click()
    assert sql_row.locator(".result-table td", has_text="3.26").count() == 1
    chart = shared.locator(".tool-chart[data-path='tips_by_day.plotly.json']")
    shared.wait_for_selector(
        ".tool-chart[data-path='tips_by_day.plotly.json'][data-state=drawn]", timeout=30_000
    )
    bar = chart.locator(".bars .point path").first  # Thur
    bar.scroll_into_view_if_needed()
    box = bar.bounding_box()
    shared.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    hover = chart.locator(".hoverlayer .hovertext")
    hover.wait_for(timeout=10_000)
    assert "2.77" in hover.text_content()
    assert_no_page_errors(carol)
