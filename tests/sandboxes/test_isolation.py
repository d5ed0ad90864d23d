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


ENVIRON_PROBE = """
import json, os
results = {}
# paw-agent is this kernel's parent (or the parent's parent, behind a guard): every
# process of the jail but this one and its children.
me = os.getpid()
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    if pid == me:
        continue
    for what in ("environ", "mem", "cmdline"):
        try:
            with open(f"/proc/{pid}/{what}", "rb") as f:
                data = f.read(1 << 20) if what != "mem" else f.read(1)
            results[f"{pid}/{what}"] = data.decode("latin-1")
        except OSError as exc:
            results[f"{pid}/{what}"] = type(exc).__name__
results["own"] = dict(os.environ)
with open("environ.json", "w") as f:
    json.dump(results, f)
print("probed")
"""


def test_run_python_cannot_read_the_runtimes_environment_with_the_provider_key(
    worker_node, scripted_model
):
    """The runtime's environment holds the provider key and datasource URLs, which its tools
    are not given; under bubblewrap they cannot read it from /proc either (paw-agent is not
    dumpable and the jail has no capabilities)."""
    require_bubblewrap()
    worker_node.use("paw-agent serve", PAW_SANDBOX_ISOLATION="bwrap")
    conversation = ConversationFactory()
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [
                {"tool_calls": [{"name": "run_python", "arguments": {"code": ENVIRON_PROBE}}]},
                "Done.",
            ],
        }
    )
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Look.")
    run = wait_for(
        lambda: Run.objects.filter(id=run.id, status__in=Run.FINISHED_STATUSES).first(), timeout=60
    )
    assert run.status == Run.Status.DONE, run.errors
    results = json.loads((workspace_ensure(conversation.id) / "environ.json").read_text())
    own = results.pop("own")
    assert SCRIPTED_API_KEY not in json.dumps(own)
    cmdlines = {key: value for key, value in results.items() if key.endswith("/cmdline")}
    assert any("paw-agent" in value for value in cmdlines.values()), cmdlines  # it was seen
    for key, value in results.items():
        if key.endswith(("/environ", "/mem")):
            assert SCRIPTED_API_KEY not in value, f"the provider key read from /proc/{key}"
    runtime = next(  # paw-agent itself, not bubblewrap's init, whose arguments name it
        key.split("/")[0]
        for key, value in cmdlines.items()
        if "paw-agent" in value and not value.split("\x00")[0].endswith("bwrap")
    )
    assert results[f"{runtime}/environ"] == "PermissionError"
    assert results[f"{runtime}/mem"] == "PermissionError"
