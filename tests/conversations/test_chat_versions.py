"""Editing the last prompt and regenerating the last answer on the chat page, in a real
browser (Debian's Chromium, a real web process and worker running paw-agent, the scripted
model): the inline editor (Escape cancels, Enter resends), the Regenerate button, the
arrows "‹ 1/3 ›" between the versions, and all of it again after a reload."""

from __future__ import annotations

import re

import pytest

from conversations.models import Conversation, Run
from tests.conftest import SCRIPTED_API_KEY
from tests.conversations.test_chat_page import (
    alice,
    ask,
    assert_no_page_errors,
    chat,
    wait_until_idle,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]
__all__ = ["alice", "chat"]  # fixtures


def answers(scripted_model, text: str) -> None:
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": text})


def shown_run(page):
    """The last turn as shown: the last run article that is not hidden."""
    return page.locator("article.run:not([hidden])").last


def test_edit_regenerate_and_switch_versions_surviving_a_reload(chat, scripted_model):
    page = chat.page
    answers(scripted_model, "Answer one.")
    ask(page, "What is 6 times 7?")
    page.locator(".answer", has_text="Answer one.").wait_for(timeout=60_000)
    wait_until_idle(page)
    run = shown_run(page)
    assert run.locator(".versions").is_hidden()  # one version: no arrows

    # The inline editor: Escape cancels and sends nothing.
    run.get_by_role("button", name="Edit").click()
    editor = page.get_by_label("Edit your message")
    assert editor.input_value() == "What is 6 times 7?"
    editor.fill("Something else")
    editor.press("Escape")
    assert editor.count() == 0
    assert run.locator(".prompt-bubble").inner_text().endswith("What is 6 times 7?")
    assert Run.objects.count() == 1

    # Enter resends the edited prompt as a new version of the turn.
    answers(scripted_model, "Answer two.")
    run.get_by_role("button", name="Edit").click()
    editor.fill("What is 6 times 8?")
    editor.press("Enter")
    page.locator(".answer", has_text="Answer two.").wait_for(timeout=60_000)
    wait_until_idle(page)
    run = shown_run(page)
    assert run.locator(".version-position").inner_text() == "2/2"
    assert run.locator(".prompt-bubble").inner_text().endswith("What is 6 times 8?")
    assert page.locator(".answer", has_text="Answer one.").is_hidden()  # kept, not shown

    # Regenerate the last answer.
    answers(scripted_model, "Answer three.")
    run.get_by_role("button", name="Regenerate").click()
    page.locator(".answer", has_text="Answer three.").wait_for(timeout=60_000)
    wait_until_idle(page)
    run = shown_run(page)
    assert run.locator(".version-position").inner_text() == "3/3"
    assert run.locator(".prompt-bubble").inner_text().endswith("What is 6 times 8?")

    # The arrows switch between the versions.
    run.get_by_role("button", name="Previous version").click()
    run = shown_run(page)
    assert run.locator(".version-position").inner_text() == "2/3"
    assert run.locator(".answer").inner_text() == "Answer two."
    run.get_by_role("button", name="Previous version").click()
    run = shown_run(page)
    assert run.locator(".version-position").inner_text() == "1/3"
    assert run.get_by_role("button", name="Previous version").is_disabled()
    assert run.locator(".answer").inner_text() == "Answer one."
    assert run.locator(".prompt-bubble").inner_text().endswith("What is 6 times 7?")
    assert page.locator("article.run:not([hidden])").count() == 1

    conversation = Conversation.objects.get(user__username="alice")
    first, second, third = Run.objects.filter(conversation=conversation).order_by("created_at")
    assert (first.replaces_id, second.replaces_id, third.replaces_id) == (
        None, first.id, second.id,
    )  # fmt: skip
    assert [r.answer for r in (first, second, third)] == [
        "Answer one.", "Answer two.", "Answer three.",
    ]  # fmt: skip

    # After a reload: the newest version, and every other one a click away.
    page.reload()
    page.wait_for_selector(".connection[data-state=connected]")
    page.locator(".answer", has_text="Answer three.").wait_for()
    run = shown_run(page)
    assert run.locator(".version-position").inner_text() == "3/3"
    assert page.locator("article.run:not([hidden])").count() == 1
    run.get_by_role("button", name="Previous version").click()
    run.get_by_role("button", name="Previous version").click()
    run = shown_run(page)
    assert run.locator(".version-position").inner_text() == "1/3"
    assert run.locator(".answer").inner_text() == "Answer one."
    run.get_by_role("button", name="Next version").click()
    assert shown_run(page).locator(".answer").inner_text() == "Answer two."

    # A new prompt: the edited turn is no longer the last, so it loses Edit and Regenerate.
    answers(scripted_model, "Fine.")
    ask(page, "Thanks.")
    page.locator(".answer", has_text="Fine.").wait_for(timeout=60_000)
    wait_until_idle(page)
    turns = page.locator("article.run:not([hidden])")
    assert turns.count() == 2
    assert turns.first.get_by_role("button", name="Edit").is_hidden()
    assert turns.first.get_by_role("button", name="Regenerate").is_hidden()
    assert turns.last.get_by_role("button", name="Edit").is_visible()
    assert turns.last.get_by_role("button", name="Regenerate").is_visible()
    assert re.fullmatch(r"\d/3", turns.first.locator(".version-position").inner_text())
    assert_no_page_errors(chat)
