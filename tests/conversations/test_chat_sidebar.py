"""The chat page's conversation list in a real browser (Debian's Chromium, Playwright,
a real web process, worker and the scripted model): live status over the person's own
websocket, day groups, and search."""

from __future__ import annotations

import re
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from conversations.models import Approval, Conversation, Run
from conversations.services.approvals import approval_decide
from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from tests.conversations import test_chat_page
from tests.conversations.test_chat_page import assert_no_page_errors
from tests.live import wait_for
from tests.scripts import delete_script

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]

# The chat page tests' fixtures: alice (with a budget) on a new conversation of hers.
alice = test_chat_page.alice
chat = test_chat_page.chat

#: Installed before the page's scripts: a Notification that records what it is asked to
#: show, with the permission starting as "default" (the person has not been asked).
NOTIFICATION_RECORDER = """
window.__notified = [];
window.Notification = class {
  static permission = "default";
  static async requestPermission() { window.Notification.permission = "granted"; return "granted"; }
  constructor(title, options) { window.__notified.push({ title, body: options.body }); }
  addEventListener() {}
};
"""

#: Makes the page believe its tab is hidden (as when the person switched tabs).
HIDE_TAB = """
Object.defineProperty(document, "visibilityState", { configurable: true, get: () => "hidden" });
document.dispatchEvent(new Event("visibilitychange"));
"""

#: Records when the conversation's "waiting for you" badge first appears (ms since epoch).
WATCH_BADGE = """(id) => {
  window.__badgeAt = null;
  const check = () => {
    if (!window.__badgeAt && document.querySelector(`li[data-conversation-id="${id}"] .waiting-badge`)) {
      window.__badgeAt = Date.now();
    }
  };
  new MutationObserver(check).observe(document.getElementById("conversation-list"), { childList: true, subtree: true });
}"""


def item(page, conversation):
    return page.locator(f'#conversation-list li[data-conversation-id="{conversation.id}"]')


def test_an_approval_raised_in_another_conversation_shows_within_a_second(
    chat, alice, scripted_model
):
    page = chat.page
    page.add_init_script(NOTIFICATION_RECORDER)
    here = Conversation.objects.get(user=alice)
    there = Conversation.objects.create(user=alice, title="Clean up the exports")
    (workspace_ensure(there.id) / "old.csv").write_text("x")
    page.reload()
    page.wait_for_selector(".connection[data-state=connected]")
    item(page, there).wait_for()
    # Notifications are asked for only from the control, a user gesture.
    page.get_by_role("button", name="Notify me").click()
    page.get_by_role("button", name="Notify me").wait_for(state="hidden")
    page.evaluate(HIDE_TAB)
    page.evaluate(WATCH_BADGE, str(there.id))
    lists = []
    page.on(
        "request",
        lambda r: lists.append(r.url) if re.search(r"/api/conversations(\?|$)", r.url) else None,
    )

    scripted_model.load(delete_script("old.csv"))
    run_start(user=alice, conversation_id=there.id, prompt="Delete old.csv")
    approval = wait_for(
        lambda: Approval.objects.filter(conversation=there, status="pending").first(),
        what="the approval",
    )
    badge = item(page, there).locator(".waiting-badge")
    badge.wait_for(timeout=5_000)
    shown_at = page.evaluate("window.__badgeAt") / 1000
    delay = shown_at - approval.created_at.timestamp()
    assert delay < 1.0, f"the sidebar showed the approval {delay:.2f} s after it was raised"
    assert re.fullmatch(r"Waiting for you · \d:\d\d", badge.inner_text())
    assert item(page, there).locator(".running-dot").count() == 1
    assert item(page, here).locator(".waiting-badge").count() == 0
    assert lists == []  # pushed over the socket, not polled
    # The hidden tab counts what waits, and the person (who allowed it) is notified.
    assert page.title().startswith("(1) ")
    assert page.evaluate("window.__notified") == [
        {
            "title": "PAW: waiting for you",
            "body": "Clean up the exports: the agent needs your answer.",
        }
    ]

    approval_decide(approval_id=approval.id, user=alice, approved=False)
    badge.wait_for(state="detached", timeout=5_000)
    item(page, there).locator(".running-dot").wait_for(state="detached", timeout=30_000)
    assert not page.title().startswith("(")
    assert Run.objects.get(conversation=there).status == "done"
    assert_no_page_errors(chat)


def at(conversation, when: datetime) -> None:
    Conversation.objects.filter(id=conversation.id).update(last_activity_at=when)


def test_conversations_are_grouped_by_day_with_their_time_and_twins_told_apart(chat, alice):
    page = chat.page
    now = timezone.localtime()
    opened = Conversation.objects.get(user=alice)
    at(opened, now - timedelta(minutes=1))
    twins = [Conversation.objects.create(user=alice, title="Sales") for _ in range(2)]
    at(twins[0], now - timedelta(minutes=3))
    at(twins[1], now - timedelta(minutes=2))
    yesterday = Conversation.objects.create(user=alice, title="Yesterday's report")
    at(yesterday, now - timedelta(days=1))
    older = Conversation.objects.create(user=alice, title="Older one")
    older_time = (now - timedelta(days=5)).replace(hour=9, minute=7)
    at(older, older_time)
    page.reload()
    item(page, older).wait_for()

    headings = page.locator("#conversation-list .day-heading").all_text_contents()
    assert headings[:2] == ["Today", "Yesterday"] and len(headings) == 3
    assert older_time.strftime("%-d") in headings[2]  # the date, e.g. "Thu 26 Nov"
    today = page.locator(".day-group", has=page.get_by_role("heading", name="Today"))
    assert today.locator("li[data-conversation-id]").count() == 3
    # The time of the last activity, as the reader's locale writes it (here en-US).
    assert re.fullmatch(r"09:07( AM)?", item(page, older).locator(".when").inner_text())
    for twin in twins:  # the same title, told apart by the start of the id
        assert item(page, twin).locator(".item-id").inner_text() == f"#{str(twin.id)[:6]}"
    assert item(page, yesterday).locator(".item-id").count() == 0
    order = page.locator("#conversation-list li[data-conversation-id]").evaluate_all(
        "(items) => items.map((i) => i.dataset.conversationId)"
    )
    assert order == [str(c.id) for c in (opened, twins[1], twins[0], yesterday, older)]
    assert_no_page_errors(chat)


#: Whether the line at a selector, laid out in the page (a list item replaced meanwhile
#: measures 0 × 0, which would read as "whole"), is shown whole.
_LINE_IS = """([selector, whole]) => {
    const line = document.querySelector(selector);
    if (!line || !line.isConnected || !line.clientWidth) return false;
    return (line.scrollWidth <= line.clientWidth && line.scrollHeight <= line.clientHeight) === whole;
}"""


def line_shown_whole(page, conversation, part: str = ".label", *, whole: bool = True) -> None:
    """Wait (up to 5 s) until ``conversation``'s line ``part`` in the sidebar is laid out
    and shown whole (or cut, with ``whole=False``); a timeout fails the test."""
    selector = f'#conversation-list li[data-conversation-id="{conversation.id}"] {part}'
    page.wait_for_function(_LINE_IS, arg=[selector, whole], timeout=5000)


#: Whether a marked word lies within its (cut or whole) line's box.
MARK_SHOWN = """(mark) => {
    const line = mark.closest(".label, .match").getBoundingClientRect();
    const box = mark.getBoundingClientRect();
    return box.left >= line.left - 0.5 && box.right <= line.right + 0.5 && box.bottom <= line.bottom + 0.5;
}"""
#: A start longer than the sidebar's line holds.
LONG_START = "Average tip by day for the restaurant's weekend bills of"


def titles_cut_alike(alice) -> tuple[Conversation, Conversation, Conversation]:
    """Two titles that differ only after what a line shows, and a long title of its own."""
    march = Conversation.objects.create(user=alice, title=f"{LONG_START} March")
    april = Conversation.objects.create(user=alice, title=f"{LONG_START} April")
    alone = Conversation.objects.create(
        user=alice, title="Quarterly numbers of the northern region, and the forecast"
    )
    return march, april, alone


def assert_told_apart(page, march, april, alone) -> None:
    for conversation in (march, april):  # whole, so the months show
        label = item(page, conversation).locator(".label")
        line_shown_whole(page, conversation)
        assert label.inner_text() == conversation.title
        assert item(page, conversation).locator(".item-id").count() == 0  # not twins
    # A long title no other one starts like keeps its one, cut, line.
    line_shown_whole(page, alone, whole=False)


def test_different_titles_cut_to_the_same_text_are_shown_whole(chat, alice):
    page = chat.page
    march, april, alone = titles_cut_alike(alice)
    page.reload()
    item(page, alone).wait_for()
    assert_told_apart(page, march, april, alone)
    assert_no_page_errors(chat)


def test_a_search_hit_in_the_cut_part_of_a_title_or_snippet_is_shown(chat, alice):
    page = chat.page
    titled = Conversation.objects.create(
        user=alice, title="Quarterly numbers of the northern region, with the Saturday forecast"
    )
    answered = Conversation.objects.create(user=alice, title="Untitled analysis")
    Run.objects.create(
        conversation=answered,
        user=alice,
        prompt="Which day was best?",
        answer="Looking at every bill of the quarter, one by one and day by day, the best was "
        "Saturday, with the highest total of tips.",
        status="done",
    )
    page.reload()
    item(page, answered).wait_for()
    line_shown_whole(page, titled, whole=False)  # cut before

    page.get_by_role("searchbox", name="Search your conversations").fill("saturday")
    item(page, titled).locator(".label mark").wait_for()
    item(page, answered).locator(".match mark").wait_for()
    assert item(page, titled).locator(".label mark").evaluate(MARK_SHOWN)
    assert item(page, answered).locator(".match mark").evaluate(MARK_SHOWN)
    line_shown_whole(page, answered, ".match")
    assert_no_page_errors(chat)


def test_the_search_box_narrows_the_list_and_marks_the_words(chat, alice):
    page = chat.page
    tips = Conversation.objects.create(user=alice, title="Tips by weekday")
    answered = Conversation.objects.create(user=alice, title="Untitled analysis")
    Run.objects.create(
        conversation=answered,
        user=alice,
        prompt="Which day was best?",
        answer="Saturday had the highest total of tips.",
        status="done",
    )
    tricky = Conversation.objects.create(user=alice, title="<img src=x onerror=alert(1)> saturday")
    other = Conversation.objects.create(user=alice, title="Budget 2027")
    page.reload()
    item(page, other).wait_for()

    box = page.get_by_role("searchbox", name="Search your conversations")
    box.fill("saturday")
    item(page, other).wait_for(state="detached")
    shown = page.locator("#conversation-list li[data-conversation-id]")
    assert shown.count() == 2
    assert item(page, tips).count() == 0
    assert item(page, answered).locator(".match").inner_text() == (
        "Saturday had the highest total of tips."
    )
    assert item(page, answered).locator(".match mark").all_inner_texts() == ["Saturday"]
    # User text is shown as text: the title's markup is not parsed.
    label = item(page, tricky).locator(".label")
    assert label.inner_text() == "<img src=x onerror=alert(1)> saturday"
    assert label.locator("mark").all_inner_texts() == ["saturday"]
    assert page.locator("#conversation-list img").count() == 0

    box.fill("tip")
    item(page, tips).wait_for()
    assert item(page, tips).locator(".label mark").all_inner_texts() == ["Tips"]
    box.fill("nothing-matches-this")
    page.get_by_text("No conversation matches.").wait_for()
    box.press("Escape")
    item(page, other).wait_for()
    assert shown.count() == 5
    assert_no_page_errors(chat)
