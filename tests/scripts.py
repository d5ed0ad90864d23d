"""Scripts for the scripted model shared by the tests that drive a real stack (the chat
page in a browser, the Python client, the ``paw`` command, the ``%%agent`` magic)."""

from __future__ import annotations

import json

from scripted_model.script import SCRIPTS_DIR
from tests.conftest import SCRIPTED_API_KEY


def demo_script() -> dict:
    """The offline demo's script (tips by day → summary.xlsx and chart.png; deleting the
    spreadsheet asks for approval)."""
    script = json.loads((SCRIPTS_DIR / "demo.json").read_text())
    return {**script, "api_key": SCRIPTED_API_KEY}


def streaming(text: str, *, chunk_delay: float, chunk: int = 5) -> dict:
    """A script answering ``text`` in ``chunk``-character deltas, ``chunk_delay`` seconds
    apart."""
    return {
        "api_key": SCRIPTED_API_KEY,
        "responses": [{"text": text, "chunk": chunk, "chunk_delay": chunk_delay}],
    }


def delete_script(path: str) -> dict:
    """The agent says it will delete ``path``, calls ``delete_file`` (an approval), then
    answers the tool's result."""
    return {
        "api_key": SCRIPTED_API_KEY,
        "responses": [
            {"text": f"I will delete {path}.", "tool_calls": [{"name": "delete_file", "arguments": {"path": path}}]},
            "Result: {{tool_result}}",
        ],
    }  # fmt: skip
