"""A worker node (``sandboxes/node.py``): its monitor (run time limits, the kill after the
cancel grace, idle shutdown) and its stop (a worker's SIGTERM leaves no runtime nor
background process). Checked in the process table."""

from __future__ import annotations

import json
import signal
import uuid

import pytest

from conversations.models import Run, RunEvent
from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from sandboxes.models import Sandbox
from tests.conftest import PAW_AGENT, SCRIPTED_API_KEY
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.conftest import require_bubblewrap
from tests.sandboxes.observe import (
    finished,
    marked_processes,
    process_alive,
    processes_with_argument,
)
from tests.sandboxes.scenarios import FAKE, SLOW

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_a_run_over_the_time_limit_is_stopped_with_code_timeout(
    worker_node, runtime, scripted_model
):
    worker_node.use(runtime, PAW_RUN_TIMEOUT_SECONDS="2")
    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "untooled": "Title", "responses": [{**SLOW, "delay": 30}]}
    )
    conversation = ConversationFactory()
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Take forever.")
    run = wait_for(lambda: finished(run.id), timeout=30)
    assert run.status == Run.Status.ERROR
    assert run.errors[0]["code"] == "timeout", run.errors


def test_an_idle_sandbox_is_shut_down_after_its_ttl(worker_node, runtime, scripted_model):
    worker_node.use(runtime, PAW_SANDBOX_TTL_SECONDS="1")
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Hi."})
    conversation = ConversationFactory()
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Hello")
    assert wait_for(lambda: finished(run.id)).status == Run.Status.DONE
    sandbox = wait_for(
        lambda: Sandbox.objects.filter(
            conversation=conversation, state=Sandbox.State.STOPPED
        ).first(),
        what="idle shutdown",
    )
    wait_for(lambda: not process_alive(sandbox.pid), what="the process to exit")
    assert marked_processes(sandbox.id) == []


def test_worker_sigterm_during_a_run_leaves_no_runtime_process_and_ends_the_run(
    worker_node, runtime, scripted_model
):
    worker_node.use(runtime, PAW_TEST_FRESH_WORKER="sigterm")
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "responses": [{**SLOW, "text": "z" * 4000}],
        }
    )
    conversation = ConversationFactory()
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Long job")
    wait_for(
        lambda: RunEvent.objects.filter(run=run, type="delta").exists(), what="the stream to begin"
    )
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    assert marked_processes(sandbox.id)
    worker_node.process.send_signal(signal.SIGTERM)
    assert worker_node.process.wait(timeout=60) == 0
    worker_node.stop()
    assert marked_processes(sandbox.id) == []
    assert not process_alive(sandbox.pid)
    run = Run.objects.get(id=run.id)
    assert run.status == Run.Status.ERROR
    assert run.errors[0]["code"] == "worker_stopped"
    assert Sandbox.objects.get(id=sandbox.id).state == Sandbox.State.STOPPED


def test_a_run_that_ignores_cancel_past_its_time_limit_is_killed_after_the_grace(
    worker_node,
):
    worker_node.use(
        FAKE,
        PAW_SANDBOX_ISOLATION="none",
        PAW_SANDBOX_READY_TIMEOUT="3",
        PAW_RUN_TIMEOUT_SECONDS="1",
        PAW_RUN_CANCEL_GRACE_SECONDS="1",
    )
    conversation = ConversationFactory()
    workspace = workspace_ensure(conversation.id)
    (workspace / "fake_mode").write_text("stubborn")
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Never stop.")
    run = wait_for(lambda: finished(run.id), timeout=30, what="the run to be ended")

    assert run.status == Run.Status.ERROR
    assert [e["code"] for e in run.errors] == ["timeout"], run.errors
    assert not RunEvent.objects.filter(run=run, type="result").exists()  # it never gave in
    sandbox = Sandbox.objects.get(conversation=conversation)
    assert "ignoring cancel" in sandbox.stderr_tail  # it was asked first …
    assert sandbox.exit_code == -signal.SIGKILL  # … then killed
    assert sandbox.state == Sandbox.State.STOPPED
    assert not process_alive(sandbox.pid)
    detached = int((workspace / "stubborn.pid").read_text())
    assert not process_alive(detached)  # its child in a session of its own went too
    assert marked_processes(sandbox.id) == []


BACKGROUND = """
import subprocess, sys
child = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(300)", TOKEN],
    start_new_session=True,
    stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
)
print("started", child.pid)
"""


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_worker_sigterm_mid_run_leaves_no_runtime_nor_background_process(
    worker_node, scripted_model, isolation
):
    if isolation == "bwrap":
        require_bubblewrap()
    worker_node.use(PAW_AGENT, PAW_SANDBOX_ISOLATION=isolation, PAW_TEST_FRESH_WORKER="bg")
    token = f"paw-background-{uuid.uuid4()}"
    code = f"TOKEN = {json.dumps(token)}\n{BACKGROUND}"
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "rules": [
                {
                    "match": "start a background job",
                    "responses": [
                        {"tool_calls": [{"name": "run_python", "arguments": {"code": code}}]},
                        {"text": "z" * 4000, "chunk": 2, "chunk_delay": 0.05},
                    ],
                }
            ],
        }
    )
    conversation = ConversationFactory()
    run = run_start(
        user=conversation.user,
        conversation_id=conversation.id,
        prompt="Please start a background job, then tell me a long story.",
    )
    wait_for(
        lambda: (
            processes_with_argument(token)
            and RunEvent.objects.filter(run=run, type="delta").exists()
        ),
        timeout=30,
        what="the background process, then the story",
    )
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    assert marked_processes(sandbox.id)

    worker_node.process.send_signal(signal.SIGTERM)
    assert worker_node.process.wait(timeout=60) == 0
    worker_node.stop()

    assert processes_with_argument(token) == []
    assert marked_processes(sandbox.id) == []
    assert not process_alive(sandbox.pid)
    run = Run.objects.get(id=run.id)
    assert run.status == Run.Status.ERROR
    assert [e["code"] for e in run.errors] == ["worker_stopped"]
    assert Sandbox.objects.get(id=sandbox.id).state == Sandbox.State.STOPPED
