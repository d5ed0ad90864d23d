"""The runtime is jailed (bubblewrap): code the agent runs cannot see the server's files —
the database file, the secret key, the project's source — nor another conversation's
workspace, and it cannot write outside its own workspace."""

from __future__ import annotations

import json

import pytest
from django.conf import settings

from conversations.models import Run
from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from tests.conftest import PAW_AGENT, SCRIPTED_API_KEY
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.processes import ROOT
from tests.sandboxes.conftest import require_bubblewrap

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


def run_python_in_jail(scripted_model, conversation, code: str, *, answer: str = "Done.",
                       prompt: str = "Look.") -> Run:
    """Run ``code`` with ``run_python`` in ``conversation``'s sandboxed runtime (the model
    calls the tool once, then answers ``answer``); the finished run, checked ``done``."""
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "responses": [
                {"tool_calls": [{"name": "run_python", "arguments": {"code": code}}]},
                answer,
            ],
        }
    )
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt=prompt)
    run = wait_for(
        lambda: Run.objects.filter(id=run.id, status__in=Run.FINISHED_STATUSES).first(), timeout=60
    )
    assert run.status == Run.Status.DONE, run.errors
    return run


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
    run_python_in_jail(scripted_model, conversation, code, prompt="Probe the sandbox.")
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
    run_python_in_jail(scripted_model, conversation, ENVIRON_PROBE)
    results = json.loads((workspace_ensure(conversation.id) / "environ.json").read_text())
    own = results.pop("own")
    assert SCRIPTED_API_KEY not in json.dumps(own)
    cmdlines = {key: value for key, value in results.items() if key.endswith("/cmdline")}
    assert any("paw-agent" in value for value in cmdlines.values()), cmdlines  # it was seen
    for key, value in results.items():
        if key.endswith(("/environ", "/mem")):
            assert SCRIPTED_API_KEY not in value, f"the provider key read from /proc/{key}"
    runtime = next(  # paw-agent itself, not bubblewrap's init nor the network relay
        key.split("/")[0]
        for key, value in cmdlines.items()
        if "paw-agent" in value
        and not value.split("\x00")[0].endswith("bwrap")
        and "jail_relay.py" not in value
    )
    assert results[f"{runtime}/environ"] == "PermissionError"
    assert results[f"{runtime}/mem"] == "PermissionError"
    relays = [
        key.split("/")[0]
        for key, value in cmdlines.items()
        if "jail_relay.py" in value and not value.split("\x00")[0].endswith("bwrap")
    ]
    assert relays, cmdlines  # the isolated network's relay (the default under bubblewrap)
    for relay in relays:  # not dumpable either
        assert results[f"{relay}/environ"] == "PermissionError"


@pytest.fixture
def bare_node(django_db_blocker, scripted_model, tmp_path):
    """Another worker node, on a machine (its PATH) without bubblewrap."""
    from tests.processes import worker_database_url
    from tests.sandboxes.conftest import ExtraWorkerNode

    with django_db_blocker.unblock():
        node = ExtraWorkerNode(
            worker_database_url(), scripted_model, name=f"{settings.PAW_NODE_NAME}-bare"
        )
    node.no_bwrap_path = str(tmp_path / "empty-bin")
    (tmp_path / "empty-bin").mkdir()
    yield node
    node.stop()


def test_with_redis_a_worker_without_bubblewrap_refuses_to_start_unless_told_so(bare_node):
    assert not settings.EMBEDDED  # the suite runs with Redis, as production does
    with pytest.raises(RuntimeError, match="did not start") as refused:
        bare_node.use(PAW_AGENT, PATH=bare_node.no_bwrap_path)
    assert "bubblewrap is not installed" in str(refused.value)
    assert "PAW_SANDBOX_ISOLATION=none" in str(refused.value)
    assert bare_node.process is None or bare_node.process.poll() is not None
    bare_node.stop()
    # The operator's explicit choice: the node starts, sandboxes run under the keeper.
    bare_node.use(PAW_AGENT, PATH=bare_node.no_bwrap_path, PAW_SANDBOX_ISOLATION="none")
    assert bare_node.process.poll() is None


FORGE = """
import json, os
found = {}
# Every descriptor of every process of the jail this code can open; then a forged result
# written where a forger would write it.
forged = {"protocol": 1, "type": "result", "seq": 999, "answer": "FORGED ANSWER",
          "errors": [], "cancelled": False, "usage": {"input": 1, "output": 1, "rounds": 1}}
for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError as exc:
        found[str(pid)] = type(exc).__name__
        continue
    links = {}
    for name in names:
        try:
            links[name] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            pass
    found[str(pid)] = links
for target in ("/proc/1/fd/0", "/proc/1/fd/1"):
    try:
        fd = os.open(target, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, (json.dumps(forged) + "\\n").encode())
        os.close(fd)
    except OSError:
        pass
with open("fds.json", "w") as f:
    json.dump(found, f)
print("tried")
"""


def test_run_python_cannot_write_or_read_the_runtimes_protocol_pipes(worker_node, scripted_model):
    """bubblewrap's init (PID 1 of the jail, readable by the sandbox's code) must not hold
    the protocol pipes: through /proc/1/fd/1 a tool could forge the run's answer, its
    approvals and its usage (an adversarial trial did)."""
    require_bubblewrap()
    worker_node.use("paw-agent serve", PAW_SANDBOX_ISOLATION="bwrap")
    conversation = ConversationFactory()
    run = run_python_in_jail(scripted_model, conversation, FORGE, answer="The real answer.")
    assert run.answer == "The real answer."
    assert run.usage["input"] > 1  # the runtime's figures, not the forged ones
    found = json.loads((workspace_ensure(conversation.id) / "fds.json").read_text())
    init = found["1"]
    assert isinstance(init, dict), init  # bubblewrap's init can be read...
    assert init["0"] == "/dev/null" and init["1"] == "/dev/null", init  # ...but holds no pipe
    assert not [fd for fd, target in init.items() if fd != "2" and target.startswith("pipe:")]
