"""What an answer rests on, under it on the chat page (a real browser, web process, worker
running paw-agent and the scripted model): "Based on: `customers`, `orders`; doc
*Revenue*; example *Monthly revenue*", shown live when the run ends and again after a
reload."""

from __future__ import annotations

import pytest

from conversations.models import Conversation
from tests.conftest import SCRIPTED_API_KEY
from tests.conversations.test_chat_page import alice, ask, assert_no_page_errors, chat
from tests.conversations.test_lineage import JOIN, shop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]
__all__ = ["alice", "chat", "shop"]  # fixtures

BASED_ON = "Based on: customers, orders; doc Revenue; example Monthly revenue"


def test_the_answer_says_what_it_rests_on_live_and_after_a_reload(
    shop, chat, scripted_model, alice
):
    conversation = Conversation.objects.get(user=alice)
    Conversation.objects.filter(pk=conversation.pk).update(datasources=["shop"])
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "responses": [
                {"tool_calls": [{"name": "run_sql", "arguments": {"datasource": "shop", "query": JOIN}}]},
                "Ada bought the most.",
            ],
        }
    )  # fmt: skip
    page = chat.page
    page.reload()
    page.wait_for_selector(".connection[data-state=connected]")
    ask(page, "What is the revenue per customer?")
    page.locator(".answer", has_text="Ada bought the most.").wait_for(timeout=60_000)
    lineage = page.locator(".run .lineage")
    lineage.wait_for(timeout=30_000)
    assert lineage.inner_text() == BASED_ON
    assert lineage.locator("code").all_inner_texts() == ["customers", "orders"]
    assert lineage.locator("em").all_inner_texts() == ["Revenue", "Monthly revenue"]

    page.reload()
    page.wait_for_selector(".connection[data-state=connected]")
    page.locator(".answer", has_text="Ada bought the most.").wait_for()
    assert page.locator(".run .lineage").inner_text() == BASED_ON
    assert_no_page_errors(chat)
