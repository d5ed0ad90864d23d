"""The runtime is jailed (bubblewrap): code the agent runs cannot see the server's files —
the database file, the secret key, the project's source — nor another conversation's
workspace, and it cannot write outside its own workspace."""

from __future__ import annotations

import json

import pytest
from django.conf import settings

from conversations.models import Run
from conversations.services.runs import run_start
from conversations.workspaces import workspace_ensure
from tests.conftest import SCRIPTED_API_KEY
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.conftest import require_bubblewrap
from tests.support import ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PROBE = """
import json, os
results = {}
for name, path in PATHS.items():
    try:
        with open(path, "rb") as f:
            f.read(1)
        results[name] = "read"
    except OSError as exc:
        results[name] = type(exc).__name__
try:
    with open(READ_ONLY, "w") as f:
        f.write("escaped")
    results["write_read_only"] = "written"
except OSError as exc:
    results["write_read_only"] = type(exc).__name__
try:  # the server's var/ folder: inside the jail, at most a private scratch copy of it
    with open(OUTSIDE, "w") as f:
        f.write("escaped")
except OSError:
    pass
results["own_workspace"] = sorted(os.listdir("."))
with open("probe.json", "w") as f:
    json.dump(results, f)
print("probed")
"""


def test_run_python_cannot_reach_the_servers_files_or_another_workspace(
    worker_node, scripted_model
):
    require_bubblewrap()  # fails (skips only with PAW_TEST_ALLOW_NO_BWRAP=1) without it
    worker_node.use("paw-agent serve", PAW_SANDBOX_ISOLATION="bwrap")
    var_dir = settings.VAR_DIR
    (var_dir / "secret_key").write_text("server-secret-key")
    (var_dir / "paw.sqlite3").write_bytes(b"SQLite format 3\x00")
    neighbour = ConversationFactory()
    (workspace_ensure(neighbour.id) / "private.csv").write_text("theirs")
    conversation = ConversationFactory()
    (workspace_ensure(conversation.id) / "mine.csv").write_text("mine")
    paths = {
        "secret_key": str(var_dir / "secret_key"),
        "database_file": str(var_dir / "paw.sqlite3"),
        "neighbour_workspace": str(workspace_ensure(neighbour.id) / "private.csv"),
        "project_settings": str(ROOT / "paw_project" / "settings.py"),
        "shadow": "/etc/shadow",
    }
    outside = str(var_dir / "escaped.txt")
    read_only = str(ROOT / "sandboxes" / "runtime" / "escaped.txt")  # the runtime's own code
    code = (
        f"PATHS = {json.dumps(paths)}\nOUTSIDE = {json.dumps(outside)}\n"
        f"READ_ONLY = {json.dumps(read_only)}\n{PROBE}"
    )
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [
                {"tool_calls": [{"name": "run_python", "arguments": {"code": code}}]},
                "Done.",
            ],
        }
    )
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="Probe the sandbox."
    )
    run = wait_for(
        lambda: Run.objects.filter(id=run.id, status__in=Run.FINISHED_STATUSES).first(), timeout=60
    )
    assert run.status == Run.Status.DONE, run.errors
    results = json.loads((workspace_ensure(conversation.id) / "probe.json").read_text())
    assert results.pop("own_workspace")[:2] == [".paw", "mine.csv"]
    denied = ("FileNotFoundError", "PermissionError", "OSError")
    assert {name: outcome for name, outcome in results.items() if outcome not in denied} == {}
    assert not (var_dir / "escaped.txt").exists()
    assert not (ROOT / "sandboxes" / "runtime" / "escaped.txt").exists()
