"""Cancel stops everything the run started, and no process of a sandbox outlives it
(issue 14, point 3), in both isolation modes, checked in the machine's process table.

The runs start background writers with ``run_python``: a ``Popen`` of a shell loop that
appends a line to a file every second (in the Python kernel's process group), and the same
loop under ``setsid env -i`` (a session of its own, an empty environment: no group kill
and no environment marker reaches it). They are found by an argument only they carry.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path

import pytest

from conversations.models import Run, RunEvent
from conversations.services.runs import run_cancel, run_start
from conversations.services.workspaces import workspace_ensure
from paw_project.errors import Conflict
from sandboxes.models import Sandbox
from tests.conftest import HARNESS, PAW_AGENT, SCRIPTED_API_KEY
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.conftest import require_bubblewrap
from tests.sandboxes.observe import (
    finished,
    marked_processes,
    process_alive,
    processes_with_argument,
)
from tests.sandboxes.scenarios import FAKE, start_with_mode

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

WRITERS = """
import subprocess
loop = 'while :; do echo x >> "$0"; sleep 1; done'
subprocess.Popen(['sh', '-c', loop, 'bg.txt', TOKEN],
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
subprocess.Popen(['setsid', 'env', '-i', 'sh', '-c', loop, 'detached.txt', TOKEN],
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print('started')
"""
STORY = {"text": "z" * 4000, "chunk": 2, "chunk_delay": 0.05}
FILES = ("bg.txt", "detached.txt")
#: Seconds after the run's start at which the cancel test cancels: from before the
#: sandbox is up, through the submit, the first model round, the kernel's start and the
#: code, to the streamed answer.
DELAYS = [round(0.25 * n, 2) for n in range(17)]


def lines(workspace: Path) -> tuple[int, ...]:
    """Lines written so far by each writer."""
    return tuple(
        len((workspace / name).read_text().splitlines()) if (workspace / name).exists() else 0
        for name in FILES
    )


def writers_script(token: str, then: dict) -> dict:
    """A script: "start the writers" runs ``WRITERS``, then answers with ``then``; any
    other prompt gets "Hello again."."""
    code = f"TOKEN = {json.dumps(token)}\n{WRITERS}"
    return {
        "api_key": SCRIPTED_API_KEY,
        "untooled": "Title",
        "fallback": "Hello again.",
        "rules": [
            {
                "match": "start the writers",
                "responses": [
                    {"tool_calls": [{"name": "run_python", "arguments": {"code": code}}]},
                    then,
                ],
            }
        ],
    }


def use(worker_node, isolation: str, **env: str):
    if isolation == "bwrap":
        require_bubblewrap()
    return worker_node.use(PAW_AGENT, PAW_SANDBOX_ISOLATION=isolation, **env)


def start_writers(scripted_model, token: str, then: dict):
    """A conversation whose run has started both writers (each wrote two lines)."""
    scripted_model.load(writers_script(token, then))
    conversation = ConversationFactory()
    workspace = workspace_ensure(conversation.id)
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="Please start the writers."
    )
    wait_for(
        lambda: min(lines(workspace)) >= 2 and len(processes_with_argument(token)) >= 2,
        timeout=60,
        what="both writers to write",
    )
    return conversation, workspace, run


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_cancel_stops_the_runs_background_writers_within_a_second(
    worker_node, scripted_model, isolation
):
    use(worker_node, isolation)
    token = f"paw-writer-{uuid.uuid4()}"
    conversation, workspace, run = start_writers(scripted_model, token, STORY)
    wait_for(lambda: RunEvent.objects.filter(run=run, type="delta").exists(), what="the story")
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)

    run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)
    cancelled = time.monotonic()
    run = wait_for(lambda: finished(run.id), timeout=10, what="the run to end")
    assert run.status == Run.Status.CANCELLED, run.errors
    time.sleep(max(0.0, cancelled + 1.0 - time.monotonic()))
    counts = lines(workspace)
    time.sleep(2.5)  # a writer still going would add two lines
    assert lines(workspace) == counts
    assert processes_with_argument(token) == []

    # The runtime stays up for the next turn: same sandbox, same process.
    again = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Hi")
    again = wait_for(lambda: finished(again.id), what="the next run")
    assert again.status == Run.Status.DONE and again.answer == "Hello again."
    assert Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES) == sandbox
    assert process_alive(sandbox.pid)


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_no_sandbox_process_survives_its_idle_shutdown(worker_node, scripted_model, isolation):
    use(worker_node, isolation, PAW_SANDBOX_TTL_SECONDS="3")
    token = f"paw-writer-{uuid.uuid4()}"
    conversation, workspace, run = start_writers(scripted_model, token, {"text": "Started."})
    assert wait_for(lambda: finished(run.id), what="the run").status == Run.Status.DONE
    sandbox = wait_for(
        lambda: Sandbox.objects.filter(
            conversation=conversation, state=Sandbox.State.STOPPED
        ).first(),
        timeout=30,
        what="the idle shutdown",
    )
    wait_for(lambda: not process_alive(sandbox.pid), what="the sandbox's process to end")
    assert wait_for(lambda: processes_with_argument(token) == [], timeout=5, what="no writer")
    assert marked_processes(sandbox.id) == []
    counts = lines(workspace)
    time.sleep(2.5)
    assert lines(workspace) == counts


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_no_sandbox_process_survives_a_kill_9_of_its_worker_nor_the_restart(
    worker_node, scripted_model, isolation
):
    use(worker_node, isolation, PAW_TEST_FRESH_WORKER=f"kill-9-{isolation}")
    token = f"paw-writer-{uuid.uuid4()}"
    conversation, workspace, run = start_writers(scripted_model, token, STORY)
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)

    worker_node.process.send_signal(signal.SIGKILL)  # no chance to clean anything up
    worker_node.process.wait(timeout=10)
    assert wait_for(lambda: processes_with_argument(token) == [], timeout=5, what="no writer")
    assert wait_for(lambda: not process_alive(sandbox.pid), timeout=5, what="its end")
    assert wait_for(lambda: marked_processes(sandbox.id) == [], timeout=5, what="no process")
    counts = lines(workspace)
    worker_node.stop()
    use(worker_node, isolation)  # the node again: it ends what the killed one left
    run = wait_for(lambda: finished(run.id), timeout=30, what="the lost run to be ended")
    assert run.status == Run.Status.ERROR and run.errors[0]["code"] == "worker_lost"
    time.sleep(1.5)
    assert lines(workspace) == counts
    assert processes_with_argument(token) == []


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_a_cancel_at_any_moment_of_a_run_ends_it_cancelled(worker_node, scripted_model, isolation):
    """A cancel while the sandbox starts, the run is submitted, the first run_python
    starts its kernel, the code runs, or the answer streams: the run ends ``cancelled``,
    never ``done``."""
    use(worker_node, isolation)
    code = "import time\ntime.sleep(0.5)\nprint('ok')"
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "responses": [],
            "rules": [
                {
                    "match": "cancel me",
                    "responses": [
                        {"tool_calls": [{"name": "run_python", "arguments": {"code": code}}]},
                        {"text": "y" * 2000, "chunk": 2, "chunk_delay": 0.02},
                    ],
                }
            ],
        }
    )
    outcomes = {}
    for delay in DELAYS:
        conversation = ConversationFactory()
        run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="cancel me")
        time.sleep(delay)
        try:
            run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)
        except Conflict as exc:  # the run ended before the cancel: recorded, and a failure
            outcomes[delay] = f"cancel refused: {exc}"
            continue
        outcomes[delay] = wait_for(lambda run=run: finished(run.id), timeout=30).status
    assert set(outcomes.values()) == {Run.Status.CANCELLED}, outcomes


def cancel_when_streaming(conversation, run):
    wait_for(lambda: RunEvent.objects.filter(run=run, type="delta").exists(), what="a delta")
    run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)


def test_a_cancel_the_runtime_missed_is_written_again_until_the_run_ends(fake_worker):
    conversation, run = start_with_mode("deaf 100")  # 10 s of deltas; misses one cancel
    cancel_when_streaming(conversation, run)
    run = wait_for(lambda: finished(run.id), timeout=8, what="the run to end")
    assert run.status == Run.Status.CANCELLED, (run.status, run.errors)
    sandbox = Sandbox.objects.get(conversation=conversation)
    assert sandbox.state in Sandbox.LIVE_STATES and process_alive(sandbox.pid)  # not killed


def test_a_run_that_finishes_done_after_its_cancel_was_accepted_ends_cancelled(fake_worker):
    conversation, run = start_with_mode("deaf 20 all")  # hears no cancel, done after 2 s
    cancel_when_streaming(conversation, run)
    run = wait_for(lambda: finished(run.id), timeout=8, what="the run to end")
    assert run.status == Run.Status.CANCELLED, (run.status, run.errors)
    assert run.answer == "finished anyway"  # what it said is kept


def test_a_runtime_ignoring_somebodys_cancel_is_killed_after_the_grace(worker_node):
    worker_node.use(
        FAKE,
        PAW_SANDBOX_ISOLATION="none",
        PAW_SANDBOX_READY_TIMEOUT="3",
        PAW_RUN_CANCEL_GRACE_SECONDS="1",
    )
    conversation, run = start_with_mode("stubborn")  # streams for ever, hears nothing
    cancel_when_streaming(conversation, run)
    run = wait_for(lambda: finished(run.id), timeout=10, what="the run to end")
    assert run.status == Run.Status.CANCELLED, (run.status, run.errors)
    sandbox = Sandbox.objects.get(conversation=conversation)
    assert sandbox.exit_code == -signal.SIGKILL
    detached = int((workspace_ensure(conversation.id) / "stubborn.pid").read_text())
    assert not process_alive(detached)


BASH_WRITERS = (
    "loop='while :; do echo x >> \"$0\"; sleep 1; done'; "
    'setsid env -i sh -c "$loop" bg.txt TOKEN </dev/null >/dev/null 2>&1 & '
    'nohup sh -c "$loop" detached.txt TOKEN </dev/null >/dev/null 2>&1 & '
    "echo started"
)


@pytest.mark.parametrize("isolation", ["bwrap", "none"])
def test_cancel_stops_what_python_agent_harness_tools_started(
    worker_node, scripted_model, isolation
):
    """python-agent-harness kills only its command's process group: the host kills the
    rest of the sandbox when a run is cancelled, and the runtime stays up."""
    if isolation == "bwrap":
        require_bubblewrap()
    # Its shell ("Bash") runs without PAW's approval gate here: this is about the cancel.
    worker_node.use(HARNESS, PAW_SANDBOX_ISOLATION=isolation, PAW_APPROVAL_REQUIRED_TOOLS="none")
    token = f"paw-writer-{uuid.uuid4()}"
    command = BASH_WRITERS.replace("TOKEN", token)
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "fallback": "Hello again.",
            "rules": [
                {
                    "match": "start the writers",
                    "responses": [
                        {"tool_calls": [{"name": "Bash", "arguments": {"command": command}}]},
                        STORY,
                    ],
                }
            ],
        }
    )
    conversation = ConversationFactory()
    workspace = workspace_ensure(conversation.id)
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="Please start the writers."
    )
    wait_for(
        lambda: min(lines(workspace)) >= 2 and RunEvent.objects.filter(run=run, type="delta"),
        timeout=60,
        what="both writers to write, then the story",
    )
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)
    cancelled = time.monotonic()
    run = wait_for(lambda: finished(run.id), timeout=10, what="the run to end")
    assert run.status == Run.Status.CANCELLED, run.errors
    time.sleep(max(0.0, cancelled + 1.0 - time.monotonic()))
    counts = lines(workspace)
    time.sleep(2.5)
    assert lines(workspace) == counts
    assert processes_with_argument(token) == []
    again = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Hi")
    again = wait_for(lambda: finished(again.id), what="the next run")
    assert again.status == Run.Status.DONE, again.errors
    assert Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES) == sandbox
    assert process_alive(sandbox.pid)
