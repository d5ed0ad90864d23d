"""Export API: a conversation as Markdown (a zip with its images), JSON (its events) and a
Jupyter notebook that validates; only for its owner; bad formats are a 400."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import nbformat
import pytest

from conversations import exports
from conversations.models import ConversationFile, Run, RunEvent
from conversations.services.workspaces import workspace_ensure
from tests.conftest import SCRIPTED_API_KEY
from tests.conversations.multipart import upload
from tests.factories import conversation_of, missing_id
from tests.live import wait_for
from tests.scripts import demo_script

ROOT = Path(__file__).resolve().parents[2]
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64
CODE = "import pandas as pd\n\ntips = pd.read_csv('tips.csv')\nprint(tips['tip'].mean())\n"


def url(conversation, export_format: str | None = "md") -> str:
    base = f"/api/conversations/{conversation.id}/export"
    return f"{base}?format={export_format}" if export_format else base


def lines_of_a_run(run) -> list[dict]:
    """The stored lines of one paw-agent run: a prompt, text, a run_python call that
    printed and wrote a chart, a list_files call, then the answer (streamed, then whole)."""
    rid = str(run.id)
    return [
        {"type": "start", "prompt": run.prompt, "run_id": rid},
        {"type": "delta", "text": "I'll average ", "run_id": rid},
        {"type": "delta", "text": "the tips.\n\n", "run_id": rid},
        {"type": "notify", "kind": "tool_start", "data": ["run_python"], "run_id": rid},
        {"type": "notify", "kind": "tool_calls", "run_id": rid, "data": [
            {"name": "run_python", "args": {"code": repr(CODE)[:99] + "…"}, "input": {"code": CODE}}
        ]},
        {"type": "notify", "kind": "tool_running", "data": "run_python", "run_id": rid},
        {"type": "notify", "kind": "tool", "run_id": rid, "data": {
            "name": "run_python", "ok": True, "summary": "wrote chart.png",
            "output": {"stdout": "2.998\n", "stderr": "", "error": None},
            "files": ["chart.png"],
        }},
        {"type": "notify", "kind": "tool_calls", "run_id": rid, "data": [
            {"name": "list_files", "args": {"path": "'.'"}, "input": {"path": "."}}
        ]},
        {"type": "notify", "kind": "tool", "run_id": rid, "data": {
            "name": "list_files", "ok": True, "summary": "2 entries",
            "output": {"stdout": "chart.png\ntips.csv", "stderr": "", "error": None},
        }},
        {"type": "delta", "text": "The average tip is **3.00**.", "run_id": rid},
        {"type": "result", "answer": "The average tip is **3.00**.", "errors": [],
         "error_messages": [], "cancelled": False, "run_id": rid},
    ]  # fmt: skip


@pytest.fixture
def conversation(user):
    conversation = conversation_of(user, title="Tips: by day / 2026")
    run = Run.objects.create(
        conversation=conversation, user=user, prompt="Average tip?", status="done"
    )
    for cursor, line in enumerate(lines_of_a_run(run), start=1):
        RunEvent.objects.create(
            conversation=conversation,
            run=run,
            cursor=cursor,
            type=line["type"],
            kind=line.get("kind", ""),
            payload=line,
        )
    folder = workspace_ensure(conversation.id)
    (folder / "tips.csv").write_text("day,tip\nSun,3.00\n")
    (folder / "chart.png").write_bytes(PNG)
    ConversationFile.objects.create(conversation=conversation, name="tips.csv", size=18, sha256="0")
    return conversation


pytestmark = pytest.mark.django_db


def test_the_notebook_validates_with_prompts_code_outputs_images_and_answers(api, conversation):
    response = api.get(url(conversation, "ipynb"))
    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ipynb+json"
    body = b"".join(response.streaming_content)
    notebook = nbformat.reads(body.decode(), as_version=4)
    nbformat.validate(notebook)
    cells = notebook.cells
    # The first cell says what the notebook assumes: the workspace files it reads.
    assert cells[0].cell_type == "markdown" and "`tips.csv`" in cells[0].source
    assert "working directory" in cells[0].source
    assert [c.cell_type for c in cells[1:]] == [
        "markdown",
        "markdown",
        "code",
        "markdown",
        "markdown",
    ]
    assert "Average tip?" in cells[1].source and cells[2].source == "I'll average the tips."
    code = cells[3]
    assert code.source == CODE  # the whole code, with its line breaks
    stream, image = code.outputs
    assert stream.output_type == "stream" and stream.name == "stdout" and stream.text == "2.998\n"
    assert image.output_type == "display_data" and image.data["image/png"]
    assert io.BytesIO(__import__("base64").b64decode(image.data["image/png"])).read() == PNG
    assert "list_files" in cells[4].source  # other tools: a note, not code
    assert cells[5].source == "The average tip is **3.00**."


def test_markdown_is_a_zip_with_the_image_linked_relatively(api, conversation):
    response = api.get(url(conversation, "md"))
    assert response.status_code == 200 and response["Content-Type"] == "application/zip"
    assert response["Content-Disposition"] == (
        'attachment; filename="Tips_ by day _ 2026.zip"; '
        "filename*=UTF-8''Tips_%20by%20day%20_%202026.zip"
    )
    archive = zipfile.ZipFile(io.BytesIO(b"".join(response.streaming_content)))
    assert sorted(archive.namelist()) == ["conversation.md", "files/chart.png"]
    assert archive.read("files/chart.png") == PNG
    text = archive.read("conversation.md").decode()
    assert "![chart.png](files/chart.png)" in text
    assert "```python\n" + CODE.rstrip("\n") + "\n```" in text
    assert "## You\n\n> Average tip?" in text and "The average tip is **3.00**." in text
    assert text.count("The average tip is **3.00**.") == 1  # the streamed copy is not repeated


def test_markdown_without_files_is_plain_markdown(api, conversation):
    (workspace_ensure(conversation.id) / "chart.png").unlink()
    response = api.get(url(conversation, "md"))
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert response["Content-Disposition"].startswith(
        'attachment; filename="Tips_ by day _ 2026.md"'
    )
    text = b"".join(response.streaming_content).decode()
    assert "*`chart.png` is not in this export (gone, or too large).*" in text


def test_json_holds_the_events_as_the_events_api_returns_them(api, conversation):
    response = api.get(url(conversation, "json"))
    assert response.status_code == 200 and response["Content-Type"] == "application/json"
    body = json.loads(b"".join(response.streaming_content))
    assert body["conversation"]["id"] == str(conversation.id)
    assert body["conversation"]["title"] == "Tips: by day / 2026"
    assert body["conversation"]["files"] == [{"name": "tips.csv", "size": 18, "sha256": "0"}]
    assert body["truncated"] is False
    polled = api.get(f"/api/conversations/{conversation.id}/events?limit=1000").json()["events"]
    assert body["events"] == polled and len(polled) == 11


def test_a_long_conversation_is_cut_and_says_so(api, conversation, monkeypatch):
    monkeypatch.setattr(exports, "EXPORT_MAX_EVENTS", 4)
    body = json.loads(b"".join(api.get(url(conversation, "json")).streaming_content))
    assert [e["cursor"] for e in body["events"]] == [1, 2, 3, 4] and body["truncated"] is True
    notebook = nbformat.reads(
        b"".join(api.get(url(conversation, "ipynb")).streaming_content).decode(), as_version=4
    )
    nbformat.validate(notebook)
    assert "first 4 events" in notebook.cells[-1].source


def test_an_image_over_the_size_cap_is_left_out(api, conversation, monkeypatch):
    monkeypatch.setattr(exports, "EXPORT_MAX_FILE_BYTES", len(PNG) - 1)
    notebook = nbformat.reads(
        b"".join(api.get(url(conversation, "ipynb")).streaming_content).decode(), as_version=4
    )
    assert [o.output_type for o in notebook.cells[3].outputs] == ["stream"]


@pytest.mark.parametrize("export_format", ["md", "json", "ipynb"])
def test_only_the_owner_can_export(other_api, conversation, export_format):
    response = other_api.get(url(conversation, export_format))
    assert response.status_code == 404
    assert response.json() == {"detail": "No such conversation.", "code": "not_found"}


def test_a_missing_conversation_is_404(api):
    response = api.get(f"/api/conversations/{missing_id()}/export?format=md")
    assert response.status_code == 404 and response.json()["code"] == "not_found"


def test_signed_out_is_401(client, conversation):
    assert client.get(url(conversation, "md")).status_code == 401


@pytest.mark.parametrize("export_format", ["pdf", "", None, "JSON"])
def test_an_unknown_format_is_a_clear_400(api, conversation, export_format):
    response = api.get(url(conversation, export_format))
    assert response.status_code == 400
    body = response.json()
    assert body["code"] in ("invalid_choice", "required") and "format" in body["detail"]


def test_an_empty_conversation_exports_too(api, user):
    empty = conversation_of(user, title="")
    notebook = nbformat.reads(
        b"".join(api.get(url(empty, "ipynb")).streaming_content).decode(), as_version=4
    )
    nbformat.validate(notebook)
    assert "no uploaded files" in notebook.cells[0].source
    response = api.get(url(empty, "md"))
    assert response["Content-Disposition"].startswith('attachment; filename="conversation.md"')


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_demos_analysis_exports_as_a_notebook_that_reruns(
    api, user, celery_worker, scripted_model, tmp_path
):
    """The real thing: the offline demo's run (upload tips.csv, ask for the average tip by
    day) exported as a notebook whose code cell re-runs on the same file."""
    scripted_model.load(demo_script())
    conversation = conversation_of(user, title="Demo")
    tips = (ROOT / "sample_data" / "tips.csv").read_bytes()
    assert upload(api, conversation.id, "tips.csv", tips).status_code == 201
    response = api.post(
        f"/api/conversations/{conversation.id}/runs",
        {"prompt": "average tip by day, as a spreadsheet and a chart"},
        format="json",
    )
    assert response.status_code == 202, response.json()
    run_url = f"/api/conversations/{conversation.id}/runs/{response.json()['id']}"
    done = wait_for(
        lambda: (r := api.get(run_url).json())["status"] in ("done", "error") and r,
        what="run end",
        timeout=120,
    )
    assert done["status"] == "done", done
    notebook = nbformat.reads(
        b"".join(api.get(url(conversation, "ipynb")).streaming_content).decode(), as_version=4
    )
    nbformat.validate(notebook)
    (code,) = [c for c in notebook.cells if c.cell_type == "code"]
    assert "pd.read_csv(path)" in code.source and "\n" in code.source
    kinds = [o.output_type for o in code.outputs]
    assert kinds == ["stream", "display_data"]
    assert "| Sun | 3.26 | 76 |" in code.outputs[0].text
    assert code.outputs[1].data["image/png"]
    # It re-runs on the same file, as its first cell says.
    assert "`tips.csv`" in notebook.cells[0].source
    (tmp_path / "tips.csv").write_bytes(tips)
    import subprocess
    import sys

    rerun = subprocess.run(
        [sys.executable, "-c", code.source],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert rerun.returncode == 0, rerun.stderr
    assert code.outputs[0].text in rerun.stdout
    archive = zipfile.ZipFile(
        io.BytesIO(b"".join(api.get(url(conversation, "md")).streaming_content))
    )
    assert {"conversation.md", "files/chart.png", "files/summary.xlsx"} <= set(archive.namelist())
    assert archive.read("files/chart.png").startswith(b"\x89PNG")
    events = json.loads(b"".join(api.get(url(conversation, "json")).streaming_content))["events"]
    assert events[0]["event"]["type"] == "start" and events[-1]["event"]["type"] == "result"
    assert SCRIPTED_API_KEY not in json.dumps(events)
