"""An ungated runtime on the chat page, in a real browser (Debian's Chromium, a real web
process and worker running the real python-agent-harness, the scripted model): the
person is told at the first run that its tools run without asking, and a call that
needed an approval is reported as having run without asking, not as stopped."""

from __future__ import annotations

import pytest

from conversations.services.workspaces import workspace_ensure
from tests.conftest import HARNESS, SCRIPTED_API_KEY
from tests.conversations.test_chat_page import (
    alice,
    ask,
    assert_no_page_errors,
    chat,
    conversation_of_page,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]
__all__ = ["alice", "chat"]  # fixtures

TOLD = "This runtime runs its tools without asking; approvals apply to paw-agent only."


def test_the_chat_page_says_the_harness_runs_its_tools_without_asking(
    chat, scripted_model, worker_node
):
    worker_node.use(HARNESS)  # with PAW_ALLOW_UNGATED_RUNTIME=1 (tests/conftest.py)
    append = {"tool_calls": [{"name": "Bash", "arguments": {"command": "echo x >> count.txt"}}]}
    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "untooled": "Title", "responses": [append, "Appended."]}
    )
    page = chat.page
    count = workspace_ensure(conversation_of_page(page).id) / "count.txt"
    ask(page, "Append x to count.txt.")
    page.wait_for_selector(".run[data-status=error]", timeout=90_000)
    assert count.read_text() == "x\n"
    for _ in range(2):  # live, then as stored (a reload)
        run = page.locator(".run").last
        assert TOLD in run.locator(".notice").first.inner_text()
        errors = run.locator(".run-errors .run-error").all_inner_texts()
        assert len(errors) == 1 and "Bash call ran without asking" in errors[0], errors
        assert "stopped" not in errors[0]
        assert page.get_by_role("alertdialog", name="Approval needed").count() == 0
        page.reload()
        page.wait_for_selector(".connection[data-state=connected]")
        page.wait_for_selector(".run[data-status=error]")
    assert_no_page_errors(chat)
