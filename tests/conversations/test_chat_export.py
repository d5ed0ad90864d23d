"""Exporting from the chat page, and tool rows that show code as it reads, in a real browser
(Debian's Chromium, a real web process and worker running paw-agent, the scripted model's
offline demo)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import nbformat
import pytest

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


def export(page, label: str):
    """Choose ``Export ▸ label`` in the header; the download."""
    page.locator("#export-menu summary").click()
    with page.expect_download() as info:
        page.locator("#export-menu").get_by_role("link", name=label).click()
    assert not page.locator("#export-menu").evaluate("menu => menu.open")  # it closed
    return info.value


def test_the_demo_exports_from_the_menu_and_its_tool_row_shows_line_breaks(
    browser_session, alice, scripted_model
):
    scripted_model.load(demo_script())
    browser_session.sign_in_as(alice)
    page = browser_session.page
    page.goto(browser_session.url("/"))
    page.wait_for_selector("#prompt")
    # Nothing to export before the conversation exists; the first upload creates it.
    assert page.locator("#export-menu").is_hidden()
    page.set_input_files("#file-input", str(TIPS))
    page.wait_for_selector("#file-chips .chip:has-text('tips.csv')")
    page.wait_for_selector("#export-menu", state="visible")
    conversation = conversation_of_page(page)

    ask(page, ASK_DEMO)
    row = page.locator(".tool[data-tool=run_python]")
    row.wait_for(timeout=60_000)
    label = row.locator(".call")
    # The code as it reads: real line breaks, no "\n" escapes, in the row itself.
    text = label.inner_text()
    assert text.startswith("run_python(code=import glob\nimport os\n\nimport matplotlib")
    assert "\\n" not in text
    # Its first lines show, more than one and not all 27: the rest when the row is opened.
    ems = label.evaluate(
        "e => e.getBoundingClientRect().height / parseFloat(getComputedStyle(e).fontSize)"
    )
    assert 2 < ems < 8, ems
    page.wait_for_selector(".tool[data-tool=run_python][data-state=ok]", timeout=60_000)
    page.locator(".answer").last.wait_for(timeout=60_000)
    wait_until_idle(page)
    answer = page.locator(".answer").last.inner_text()
    assert "files written" not in answer and answer.count("summary.xlsx") == 1

    notebook_download = export(page, "Notebook")
    assert notebook_download.suggested_filename.endswith(".ipynb")
    notebook = nbformat.reads(Path(notebook_download.path()).read_text(), as_version=4)
    nbformat.validate(notebook)
    (code,) = [c for c in notebook.cells if c.cell_type == "code"]
    assert "else pd.read_csv(path)\n" in code.source  # the demo's code, whole lines
    assert [o.output_type for o in code.outputs] == ["stream", "display_data"]
    assert "`tips.csv`" in notebook.cells[0].source

    markdown = export(page, "Markdown")
    assert markdown.suggested_filename.endswith(".zip")
    archive = zipfile.ZipFile(io.BytesIO(Path(markdown.path()).read_bytes()))
    assert archive.read("files/chart.png").startswith(b"\x89PNG")
    assert "![chart.png](files/chart.png)" in archive.read("conversation.md").decode()

    events = json.loads(Path(export(page, "JSON").path()).read_text())
    assert events["conversation"]["id"] == str(conversation.id)
    assert [e["event"]["type"] for e in events["events"]][-1] == "result"
    assert_no_page_errors(browser_session)
