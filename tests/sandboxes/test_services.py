"""The node side (``sandboxes/services.py``), through real workers and runtime processes
against the scripted model: executing runs in a conversation's sandbox (reuse, memory,
respawn, eviction, model change), delivering cancels and stops, and the reaper."""

from __future__ import annotations

import json
import os
import signal

import pytest
from celery.signals import before_task_publish
from django.db import transaction

from conversations.models import Approval, Conversation, Run, RunEvent
from conversations.selectors.workspaces import workspace_path
from conversations.services.conversations import conversation_delete
from conversations.services.runs import run_cancel, run_start
from paw_project.errors import Conflict
from sandboxes.enqueue import TASK_SANDBOX_STOP_DELIVER, node_queue
from sandboxes.models import Sandbox
from tests.conftest import PAW_AGENT, SCRIPTED_API_KEY, api_client_for
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.observe import (
    finished,
    marked_processes,
    model_saw,
    process_alive,
    process_start_time,
    sandbox_pids,
)
from tests.sandboxes.scenarios import SLOW, STORY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


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


def test_one_celery_thread_serves_two_conversations_streaming_at_the_same_time(
    solo_node, scripted_model
):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": STORY})
    a, b = ConversationFactory(), ConversationFactory()
    runs = [
        run_start(user=c.user, conversation_id=c.id, prompt="A long story, please.") for c in (a, b)
    ]
    ids = [run.id for run in runs]
    # With one Celery thread, a task that waited for its run would hold the other run back
    # until the story (~100 s) ended.
    wait_for(
        lambda: (
            Run.objects.filter(id__in=ids, status=Run.Status.RUNNING).count() == 2
            and all(RunEvent.objects.filter(run_id=i, type="delta").count() >= 3 for i in ids)
        ),
        what="both runs to stream at once",
    )
    assert set(Run.objects.filter(id__in=ids).values_list("node", flat=True)) == {solo_node.name}
    for conversation, run in zip((a, b), runs, strict=True):
        run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)
    ended = [wait_for(lambda i=i: finished(i), what="the cancelled runs to end") for i in ids]
    assert [run.status for run in ended] == [Run.Status.CANCELLED] * 2


SCRIPT = {"api_key": SCRIPTED_API_KEY, "fallback": "Noted."}


def a_finished_run_with_a_live_sandbox(conversation, api) -> Sandbox:
    response = api.post(
        f"/api/conversations/{conversation.id}/runs", {"prompt": "Remember 42."}, format="json"
    )
    assert response.status_code == 202, response.content
    run = wait_for(lambda: finished(response.json()["id"]), what="the run to end")
    assert run.status == Run.Status.DONE, run.errors
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    assert process_alive(sandbox.pid)
    return sandbox


def gone(sandbox: Sandbox) -> bool:
    return not process_alive(sandbox.pid) and not marked_processes(sandbox.id)


def test_deleting_a_conversation_stops_its_sandbox_and_removes_its_workspace(
    celery_worker, scripted_model
):
    scripted_model.load(SCRIPT)
    conversation = ConversationFactory()
    api = api_client_for(conversation.user)
    sandbox = a_finished_run_with_a_live_sandbox(conversation, api)
    (workspace_path(conversation.id) / "data.csv").write_text("a,b\n")

    assert api.delete(f"/api/conversations/{conversation.id}").status_code == 204
    wait_for(lambda: gone(sandbox), what="the sandbox's processes to end")
    wait_for(lambda: not workspace_path(conversation.id).exists(), what="the workspace to go")
    assert not Conversation.objects.filter(id=conversation.id).exists()


def test_a_deleted_conversation_s_sandbox_is_stopped_once_the_delete_commits(
    celery_worker, scripted_model
):
    """Sent inside the delete's transaction, the stop reached the node while the delete held
    the conversation's rows; the node recorded the sandbox's end (its row, then the run's)
    and the delete (the run's rows, then the sandbox's) deadlocked: 500 one run in ten."""
    scripted_model.load(SCRIPT)
    conversation = ConversationFactory()
    sandbox = a_finished_run_with_a_live_sandbox(conversation, api_client_for(conversation.user))
    published: list[tuple[str, str]] = []

    def published_task(sender=None, routing_key=None, **kwargs):
        published.append((sender, routing_key))

    before_task_publish.connect(published_task)
    try:
        with transaction.atomic():
            conversation_delete(user=conversation.user, conversation_id=conversation.id)
            assert published == []  # nothing reaches a node before the delete is committed
        assert published == [(TASK_SANDBOX_STOP_DELIVER, node_queue(sandbox.node))]
    finally:
        before_task_publish.disconnect(published_task)
    wait_for(lambda: gone(sandbox), what="the sandbox's processes to end")
    wait_for(lambda: not workspace_path(conversation.id).exists(), what="the workspace to go")


def test_forgetting_the_session_stops_the_sandbox_and_the_next_one_starts_afresh(
    celery_worker, scripted_model
):
    scripted_model.load(SCRIPT)
    conversation = ConversationFactory()
    api = api_client_for(conversation.user)
    sandbox = a_finished_run_with_a_live_sandbox(conversation, api)

    response = api.delete(f"/api/conversations/{conversation.id}/session")
    assert response.status_code == 204
    wait_for(lambda: gone(sandbox), what="the sandbox's processes to end")
    # The node records the exit once its reader has seen the end of the process's output.
    wait_for(
        lambda: Sandbox.objects.get(id=sandbox.id).state == Sandbox.State.STOPPED,
        what="the sandbox to be recorded stopped",
    )
    assert api.get(f"/api/conversations/{conversation.id}/history").json()["count"] == 1

    scripted_model.clear_log()
    response = api.post(
        f"/api/conversations/{conversation.id}/runs", {"prompt": "What was it?"}, format="json"
    )
    wait_for(lambda: finished(response.json()["id"]), what="the second run")
    new = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    assert new.pid != sandbox.pid
    [request] = [r for r in scripted_model.requests if r.get("tools")]
    said = " ".join(str(m.get("content")) for m in request["messages"])
    assert "Remember 42." not in said  # the earlier turn was forgotten
    assert "What was it?" in said
