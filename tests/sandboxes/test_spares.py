"""Spare sandboxes (``PAW_SANDBOX_SPARES``): ready paw-agent processes a node keeps and
hands to new conversations. What is pinned: a new conversation's run is served by the
spare (same process), in the conversation's workspace, with the run's variables and
network, while the spare held nothing of anybody before; the node refills; a spare is
used once; a spare that died is replaced; spares count against the node's limit and are
the first to go; none outlives the worker; the harness runtime gets none."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
from pathlib import Path

import pytest
from django.test import override_settings

from conversations.models import Run
from conversations.selectors.workspaces import workspace_path
from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from sandboxes.models import Sandbox
from sandboxes.network import (
    FIRST_FORWARD_PORT,
    Forward,
    NetworkPlan,
    NetworkPolicy,
    SandboxNetwork,
    spare_plan,
)
from sandboxes.spares import spares_folder
from secrets_vault.services import secret_set
from tests.conftest import HARNESS, PAW_AGENT, SCRIPTED_API_KEY
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.conftest import require_bubblewrap
from tests.sandboxes.observe import (
    finished,
    marked_processes,
    process_alive,
    process_command_line,
    process_environment,
    resource_limits,
)
from tests.sandboxes.test_environment import CANARIES, LIMITS, expected_limits, leaks

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DUMP = """
import json, os
open("made-here.txt", "w").write("hello")
with open("seen.json", "w") as f:
    json.dump({"environ": dict(os.environ), "cwd": os.getcwd()}, f)
print("dumped")
"""


def children(pid: int) -> list[int]:
    """The live children of ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def spares_of(node) -> list[int]:
    """The node's spares: the root processes the worker started with ``--spare`` that no
    live ``Sandbox`` row names (a handed-over spare keeps its command line)."""
    owned = set(Sandbox.objects.filter(state__in=Sandbox.LIVE_STATES).values_list("pid", flat=True))
    return sorted(
        pid
        for pid in children(node.process.pid)
        if "--spare" in process_command_line(pid) and pid not in owned
    )


def one_spare(node, *, other_than: tuple[int, ...] = ()) -> int:
    """Wait for the node to have exactly one spare (not one of ``other_than``); its pid."""
    found = wait_for(
        lambda: [p for p in spares_of(node) if p not in other_than] or None,
        timeout=60,
        what="a spare",
    )
    assert len(found) == 1, found
    return found[0]


def folder_of(pid: int) -> Path:
    """The folder a sandbox was started in (its ``--project``)."""
    argv = process_command_line(pid)
    return Path(argv[len(argv) - 1 - argv[::-1].index("--project") + 1])


def run_python(scripted_model, conversation, code: str = DUMP) -> Run:
    """Run ``code`` with ``run_python`` in ``conversation`` (one tool call, then "Done.");
    the finished run, checked ``done``."""
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "responses": [
                {"tool_calls": [{"name": "run_python", "arguments": {"code": code}}]},
                "Done.",
            ],
        }
    )
    scripted_model.clear_log()  # this test's requests only (the session's model served others)
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Look.")
    run = wait_for(lambda: finished(run.id), timeout=60)
    assert run.status == Run.Status.DONE, run.errors
    return run


def live_sandbox(conversation) -> Sandbox:
    return Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)


def test_a_new_conversation_is_handed_the_ready_spare_which_held_nothing_of_anybody_before(
    worker_node, scripted_model
):
    require_bubblewrap()
    worker_node.use(PAW_AGENT, PAW_SANDBOX_SPARES="1", **CANARIES, **LIMITS)
    worker = process_environment(worker_node.process.pid)
    spare = one_spare(worker_node)
    conversation = ConversationFactory()
    secret_set(name="ALICE_TOKEN", value="alice-token-value", user=conversation.user)
    started_with, argv = process_environment(spare), process_command_line(spare)
    folder = folder_of(spare)

    # Before: nothing of a person, nor of the server: its own folder, no provider, key,
    # model or secret, no row.
    assert "--spare" in argv and str(conversation.id) not in " ".join(argv)
    assert folder.parent == spares_folder(worker_node.name) and folder.is_dir()
    assert leaks(started_with, worker) == set()
    assert not [name for name in started_with if name.startswith(("OPENAI_", "PAW_DATA"))]
    assert "ALICE_TOKEN" not in started_with
    assert not [v for v in started_with.values() if SCRIPTED_API_KEY in v or "alice" in v]
    assert not Sandbox.objects.filter(pid=spare).exists()
    with open(f"/proc/{spare}/limits") as f:
        limits = resource_limits(f.read())
    assert {name: limits[name] for name in expected_limits()} == expected_limits()

    run_python(scripted_model, conversation)

    # After: the same process is the conversation's sandbox, in its workspace, with the
    # run's variables (through its secrets pipe), reaching the run's model.
    sandbox = live_sandbox(conversation)
    assert sandbox.pid == spare and process_alive(spare)
    workspace = workspace_path(conversation.id)
    assert (workspace / "made-here.txt").read_text() == "hello"
    assert not folder.exists()  # renamed: it is the conversation's workspace now
    seen = json.loads((workspace / "seen.json").read_text())
    assert seen["environ"]["ALICE_TOKEN"] == "alice-token-value"
    assert leaks(seen["environ"], worker) == set()
    assert not [name for name in seen["environ"] if name.startswith("OPENAI_")]
    assert {entry["authorization"] for entry in scripted_model.log} == {
        f"Bearer {SCRIPTED_API_KEY}"
    }
    assert "ALICE_TOKEN" not in process_environment(spare)  # never in its environment

    # The node refills, and the next new conversation gets the new spare: a spare is
    # used once.
    refill = one_spare(worker_node, other_than=(spare,))
    other = ConversationFactory()
    run_python(scripted_model, other, code="print('second')")
    assert live_sandbox(other).pid == refill
    assert live_sandbox(conversation).pid == spare
    assert not (workspace_path(other.id) / "seen.json").exists()


def test_without_a_jail_the_spare_takes_the_conversations_workspace_path(
    worker_node, scripted_model
):
    worker_node.use(PAW_AGENT, PAW_SANDBOX_SPARES="1", PAW_SANDBOX_ISOLATION="none")
    spare = one_spare(worker_node)
    conversation = ConversationFactory()
    run_python(scripted_model, conversation)
    assert live_sandbox(conversation).pid == spare
    workspace = workspace_path(conversation.id)
    seen = json.loads((workspace / "seen.json").read_text())
    # The folder was renamed under the running process: it works there, by the new path.
    assert seen["cwd"] == str(workspace)
    for name in ("HOME", "TMPDIR", "XDG_CACHE_HOME"):
        assert seen["environ"][name].startswith(f"{workspace}/.paw/"), name


def test_a_spare_that_died_is_replaced_and_leaves_nothing(worker_node, scripted_model):
    worker_node.use(PAW_AGENT, PAW_SANDBOX_SPARES="1")
    spare = one_spare(worker_node)
    marker = process_environment(spare)["PAW_SANDBOX_ID"]
    folder = folder_of(spare)
    os.kill(spare, signal.SIGKILL)
    replacement = one_spare(worker_node, other_than=(spare,))
    assert process_alive(replacement) and not process_alive(spare)
    assert marked_processes(marker) == []
    wait_for(lambda: not folder.exists(), what="the dead spare's folder to go")
    conversation = ConversationFactory()
    run_python(scripted_model, conversation, code="print('hi')")
    assert live_sandbox(conversation).pid == replacement


def test_no_spare_outlives_its_worker(worker_node):
    worker_node.use(PAW_AGENT, PAW_SANDBOX_SPARES="2")
    spares = wait_for(
        lambda: len(spares_of(worker_node)) == 2 and spares_of(worker_node), what="two spares"
    )
    markers = [process_environment(pid)["PAW_SANDBOX_ID"] for pid in spares]
    folder = spares_folder(worker_node.name)
    assert folder.is_dir()
    worker_node.stop()
    assert not [pid for pid in spares if process_alive(pid)]
    assert [marked_processes(marker) for marker in markers] == [[], []]
    assert not folder.exists()


def test_spares_count_against_the_node_limit_and_go_before_anybodys_sandbox(
    worker_node, scripted_model
):
    worker_node.use(PAW_AGENT, PAW_SANDBOX_SPARES="1", PAW_MAX_SANDBOXES_PER_NODE="2")
    first = one_spare(worker_node)
    a = ConversationFactory()
    run_python(scripted_model, a, code="print('a')")
    assert live_sandbox(a).pid == first
    second = one_spare(worker_node, other_than=(first,))  # A and a spare: the limit

    # B has a file before its first run (an upload came first): no spare can take that
    # workspace, so B's sandbox is spawned, and the room it needs is the spare's, not A's.
    b = ConversationFactory()
    (workspace_ensure(b.id) / "data.csv").write_text("x\n1\n")
    run_python(scripted_model, b, code="print(open('data.csv').read())")
    sandbox_b = live_sandbox(b)
    assert sandbox_b.pid not in (first, second)
    assert "--spare" not in process_command_line(sandbox_b.pid)
    assert not process_alive(second)
    assert live_sandbox(a).pid == first and process_alive(first)
    # A and B fill the node: no spare comes back.
    assert spares_of(worker_node) == []

    # C, new and empty, finds no spare: the least recently used idle sandbox (A's) goes.
    c = ConversationFactory()
    run_python(scripted_model, c, code="print('c')")
    assert "--spare" not in process_command_line(live_sandbox(c).pid)
    assert not Sandbox.objects.filter(conversation=a, state__in=Sandbox.LIVE_STATES).exists()
    assert not process_alive(first)
    assert spares_of(worker_node) == []


def test_the_harness_runtime_gets_no_spare_and_is_spawned_as_before(worker_node, scripted_model):
    worker_node.use(HARNESS, PAW_SANDBOX_SPARES="1")
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Hi."})
    conversation = ConversationFactory()
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Hi")
    assert wait_for(lambda: finished(run.id), timeout=60).status == Run.Status.DONE
    sandbox = live_sandbox(conversation)
    argv = process_command_line(sandbox.pid)
    assert any("python-agent-harness" in a for a in argv) and "--spare" not in argv
    assert spares_of(worker_node) == []
    assert not spares_folder(worker_node.name).exists()


# --- the spare's network before and after its hand-over ---------------------------------


class Listener:
    """A TCP listener on loopback that answers ``hello``."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.sendall(b"hello")


def _through(folder: Path, preface: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(folder / "forward.sock"))
        sock.sendall(preface)
        sock.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        return data


def test_a_spares_network_allows_nothing_until_its_hand_over_then_the_runs_plan():
    listener = Listener()
    refused: list[str] = []
    with override_settings(PAW_SANDBOX_ALLOWED_HOSTS=[f"127.0.0.1:{listener.port}"]):
        network = SandboxNetwork(spare_plan(), lambda destination, _: refused.append(destination))
        folder = network.start()
        try:
            # Before: not even the operator's allowed hosts, nor its forward ports.
            assert _through(folder, f"TCP 127.0.0.1 {listener.port}\n".encode()).startswith(
                b"paw: 127.0.0.1"
            )
            answer = _through(folder, f"PORT {FIRST_FORWARD_PORT}\n".encode())
            assert answer.startswith(b"paw: nothing is forwarded on port"), answer
            answer = _through(
                folder, f"PROXY\nCONNECT 127.0.0.1:{listener.port} HTTP/1.1\r\n\r\n".encode()
            )
            assert answer.startswith(b"HTTP/1.1 403 Forbidden by PAW"), answer

            # The hand-over gives it the run's plan: its forward port leads to the run's
            # destination, and nothing else is allowed.
            network.plan = NetworkPlan(
                policy=NetworkPolicy(allowed=frozenset({("127.0.0.1", listener.port)})),
                forwards=(Forward(FIRST_FORWARD_PORT, "127.0.0.1", listener.port),),
            )
            assert _through(folder, f"PORT {FIRST_FORWARD_PORT}\n".encode()) == b"hello"
            answer = _through(folder, f"PORT {FIRST_FORWARD_PORT + 1}\n".encode())
            assert answer.startswith(b"paw: nothing is forwarded on port")
        finally:
            network.close()
            listener.sock.close()
    # The node logs each refusal (its callback runs on a helper thread).
    wait_for(lambda: len(refused) == 4, what="the refusals to be reported")
