"""Runs through real workers and real runtime processes against the scripted model."""

from __future__ import annotations

import json
import os
import signal

import pytest

from conversations.models import Run, RunEvent
from conversations.services.runs import run_cancel, run_start
from paw_project.errors import Conflict
from sandboxes.models import Sandbox
from tests.conftest import HARNESS, PAW_AGENT, SCRIPTED_API_KEY
from tests.factories import ConversationFactory
from tests.live import GroupListener, wait_for
from tests.sandboxes.observe import (
    finished,
    marked_processes,
    process_alive,
    process_start_time,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(params=[PAW_AGENT, HARNESS], ids=["paw-agent", "harness"], scope="module")
def runtime(request):
    return request.param


@pytest.fixture
def worker(worker_node, runtime):
    return worker_node.use(runtime)


def test_a_run_end_to_end_is_stored_with_increasing_cursors_and_sent_live(worker, scripted_model):
    scripted_model.load(
        {
            "api_key": "sk-scripted-test-key",
            "untooled": "A title",
            "fallback": "Hello from the model.",
        }
    )
    conversation = ConversationFactory()
    with GroupListener(conversation.id) as listener:
        run = run_start(
            user=conversation.user, conversation_id=conversation.id, prompt="Say hello."
        )
        done = wait_for(lambda: finished(run.id), what="the run to finish")
        listener.wait(
            lambda lis: any(e["event"]["type"] == "result" for e in lis.events()),
            what="result live",
        )
    assert done.status == Run.Status.DONE, (done.errors, worker.output()[-3000:])
    assert "Hello from the model." in done.answer
    assert done.usage["input"] > 0 and done.usage["output"] > 0
    stored = list(RunEvent.objects.filter(conversation=conversation).order_by("cursor"))
    cursors = [e.cursor for e in stored]
    assert cursors == list(range(1, len(stored) + 1))
    assert stored[0].type == "start" and stored[-1].type == "result"
    live = listener.events()
    assert [e["cursor"] for e in live] == cursors
    assert [e["event"] for e in live] == [e.payload for e in stored]
    statuses = [m["status"] for m in listener.of_type("run.status")]
    assert statuses[-1] == "done" and "running" in statuses
    sandbox = Sandbox.objects.get(conversation=conversation)
    assert sandbox.state == Sandbox.State.READY and sandbox.pid


def sandbox_pids(conversation):
    return list(
        Sandbox.objects.filter(conversation=conversation)
        .order_by("started_at")
        .values_list("pid", flat=True)
    )


def model_saw(scripted_model, text: str) -> bool:
    return any(
        text in json.dumps(entry["body"].get("messages", [])) for entry in scripted_model.log
    )


SLOW = {"text": "x" * 400, "chunk": 2, "chunk_delay": 0.05}


def test_second_run_reuses_the_process_and_the_agent_remembers_the_first(worker, scripted_model):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Noted."})
    conversation = ConversationFactory()
    first = run_start(
        user=conversation.user,
        conversation_id=conversation.id,
        prompt="My favourite colour is teal.",
    )
    assert wait_for(lambda: finished(first.id)).status == Run.Status.DONE
    sandbox = Sandbox.objects.get(conversation=conversation)
    started = process_start_time(sandbox.pid)
    assert started is not None and sandbox.pid in marked_processes(sandbox.id)
    scripted_model.clear_log()
    second = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="What is my colour?"
    )
    assert wait_for(lambda: finished(second.id)).status == Run.Status.DONE
    # The same process served both runs: one sandbox, same pid, same start time.
    assert sandbox_pids(conversation) == [sandbox.pid]
    assert process_start_time(sandbox.pid) == started
    assert model_saw(scripted_model, "My favourite colour is teal.")


def test_two_conversations_run_at_the_same_time_on_one_node(worker, scripted_model):
    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": {**SLOW, "text": "y" * 60}}
    )
    a, b = ConversationFactory(), ConversationFactory()
    run_a = run_start(user=a.user, conversation_id=a.id, prompt="Tell me a story.")
    run_b = run_start(user=b.user, conversation_id=b.id, prompt="Tell me another.")
    run_a, run_b = (wait_for(lambda r=r: finished(r.id), timeout=60) for r in (run_a, run_b))
    assert run_a.status == run_b.status == Run.Status.DONE
    assert (
        run_a.started_at < run_b.finished_at and run_b.started_at < run_a.finished_at
    )  # they overlapped
    assert sandbox_pids(a) != sandbox_pids(b)


def test_cancel_mid_stream_ends_the_run_cancelled(worker, scripted_model):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "responses": [SLOW]})
    conversation = ConversationFactory()
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="Stream for a while."
    )
    wait_for(
        lambda: RunEvent.objects.filter(run=run, type="delta").count() >= 3, what="some deltas"
    )
    run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)
    run = wait_for(lambda: finished(run.id))
    assert run.status == Run.Status.CANCELLED
    assert (
        RunEvent.objects.filter(run=run, type="delta").count() < 200
    )  # it did not stream to the end
    # The conversation stays usable.
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Back."})
    again = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="Still there?"
    )
    assert wait_for(lambda: finished(again.id)).status == Run.Status.DONE


def test_a_queued_run_is_cancelled_at_once(worker, scripted_model):
    conversation = ConversationFactory()
    run = Run.objects.create(
        conversation=conversation, user=conversation.user, prompt="never dispatched"
    )
    cancelled = run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)
    assert cancelled.status == Run.Status.CANCELLED
    with pytest.raises(Conflict):
        run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)


def test_a_second_run_while_one_is_active_is_refused(worker, scripted_model):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "responses": [SLOW]})
    conversation = ConversationFactory()
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Busy.")
    with pytest.raises(Conflict) as refused:
        run_start(user=conversation.user, conversation_id=conversation.id, prompt="Me too.")
    assert refused.value.code == "run_active"
    run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)
    wait_for(lambda: finished(run.id))


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


def test_the_least_recently_used_idle_sandbox_is_evicted_at_capacity(
    worker_node, runtime, scripted_model
):
    worker_node.use(runtime, PAW_MAX_SANDBOXES_PER_NODE="2")
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Hi."})
    a, b, c = ConversationFactory(), ConversationFactory(), ConversationFactory()

    def run_in(conversation) -> Sandbox:
        run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Hi")
        assert wait_for(lambda: finished(run.id)).status == Run.Status.DONE
        return Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)

    sandbox_a, sandbox_b = run_in(a), run_in(b)
    assert run_in(a).id == sandbox_a.id  # A is used again after B: B is now the older one
    sandbox_c = run_in(c)

    sandbox_b.refresh_from_db()
    assert sandbox_b.state == Sandbox.State.STOPPED
    assert not process_alive(sandbox_b.pid) and marked_processes(sandbox_b.id) == []
    for kept in (sandbox_a, sandbox_c):
        kept.refresh_from_db()
        assert kept.state == Sandbox.State.READY and process_alive(kept.pid)


def test_a_killed_runtime_fails_its_run_and_the_next_run_respawns_with_history(
    worker, runtime, scripted_model
):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Noted."})
    conversation = ConversationFactory()
    first = run_start(
        user=conversation.user,
        conversation_id=conversation.id,
        prompt="Remember: the code is 4711.",
    )
    assert wait_for(lambda: finished(first.id)).status == Run.Status.DONE
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "responses": [SLOW]})
    second = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="Stream, then die."
    )
    wait_for(
        lambda: RunEvent.objects.filter(run=second, type="delta").exists(),
        what="the stream to begin",
    )
    victim = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    os.kill(victim.pid, signal.SIGKILL)
    second = wait_for(lambda: finished(second.id))
    assert second.status == Run.Status.ERROR
    assert second.errors[0]["code"] == "sandbox_exited"
    assert second.errors[0]["message"].startswith("sandbox exited (code -9)")
    assert marked_processes(victim.id) == []

    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "It is 4711."}
    )
    scripted_model.clear_log()
    third = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="What was the code?"
    )
    assert wait_for(lambda: finished(third.id)).status == Run.Status.DONE
    assert len(sandbox_pids(conversation)) == 2
    if runtime == PAW_AGENT:  # it offers `history`: the new process was told the first turn
        assert model_saw(scripted_model, "Remember: the code is 4711.")
    else:  # python-agent-harness cannot restore history: the user is told
        notice = RunEvent.objects.get(conversation=conversation, type="notice", kind="memory_lost")
        assert "without its earlier context" in notice.payload["message"]


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


def test_a_model_change_between_runs_restarts_the_sandbox_with_the_history(
    worker, runtime, scripted_model
):
    from secrets_vault.providers import models_cache_forget

    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "models": ["scripted-model", "scripted-model-2"], "untooled": "Title",
         "fallback": "Noted."}
    )  # fmt: skip
    models_cache_forget(base_url=scripted_model.base_url, api_key=SCRIPTED_API_KEY)
    conversation = ConversationFactory()
    first = run_start(
        user=conversation.user,
        conversation_id=conversation.id,
        prompt="Remember: the colour is blue.",
    )
    assert wait_for(lambda: finished(first.id)).status == Run.Status.DONE
    scripted_model.clear_log()
    second = run_start(
        user=conversation.user,
        conversation_id=conversation.id,
        prompt="Which colour?",
        llm_model="scripted-model-2",
    )
    second = wait_for(lambda: finished(second.id))
    assert second.status == Run.Status.DONE, second.errors
    assert second.model == "scripted-model-2"
    assert len(sandbox_pids(conversation)) == 2  # a new process for the new model
    # (Other tests' sandboxes may still be talking to the shared model server: look at ours.)
    ours = [
        e
        for e in scripted_model.log
        if "Which colour?" in json.dumps(e["body"].get("messages", []))
    ]
    assert ours and {entry["body"]["model"] for entry in ours} == {"scripted-model-2"}
    if runtime == PAW_AGENT:
        assert model_saw(scripted_model, "Remember: the colour is blue.")
    else:
        assert RunEvent.objects.filter(
            conversation=conversation, type="notice", kind="memory_lost"
        ).exists()


def test_the_reaper_closes_what_a_silent_node_left_behind_and_requeues_lost_runs(
    worker, scripted_model
):
    from datetime import timedelta

    from django.utils import timezone

    from conversations.models import Approval
    from sandboxes.models import WorkerNode
    from sandboxes.services import nodes_reap

    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Recovered."}
    )
    long_ago = timezone.now() - timedelta(minutes=10)
    WorkerNode.objects.create(name="lost-node", heartbeat_at=long_ago, started_at=long_ago)
    stranded = ConversationFactory()
    sandbox = Sandbox.objects.create(
        conversation=stranded, node="lost-node", command="x", state="busy", pid=999999
    )
    running = Run.objects.create(
        conversation=stranded, user=stranded.user, prompt="p", status="running", node="lost-node"
    )
    approval = Approval.objects.create(
        conversation=stranded,
        run=running,
        kind="confirm",
        prompt="rm",
        expires_at=timezone.now() + timedelta(minutes=5),
    )
    waiting = ConversationFactory()
    lost_task = Run.objects.create(conversation=waiting, user=waiting.user, prompt="Are you there?")
    Run.objects.filter(id=lost_task.id).update(created_at=long_ago)  # its task was lost

    counts = nodes_reap()

    assert (
        counts["nodes"] >= 1
        and counts["sandboxes"] >= 1
        and counts["runs"] >= 1
        and counts["requeued"] >= 1
    )
    assert Sandbox.objects.get(id=sandbox.id).state == Sandbox.State.DEAD
    running.refresh_from_db()
    assert running.status == Run.Status.ERROR and running.errors[0]["code"] == "worker_lost"
    assert Approval.objects.get(id=approval.id).status == Approval.Status.CANCELLED
    assert WorkerNode.objects.get(name="lost-node").stopped_at is not None
    recovered = wait_for(lambda: finished(lost_task.id), what="the requeued run")
    assert recovered.status == Run.Status.DONE and recovered.answer.endswith("Recovered.")
