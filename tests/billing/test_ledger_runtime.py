"""The usage ledger and the during-run budgets, through a real worker running real
paw-agent processes against the scripted model: every finished run is billed exactly
once (done, cancelled, crashed), and a run that passes its budget is stopped and billed."""

from __future__ import annotations

import os
import signal

import pytest

from billing.models import Budget, UsageEvent
from billing.services import estimate_tokens, usage_record
from conversations.models import Run, RunEvent
from conversations.services.runs import run_cancel, run_finish, run_start
from sandboxes.models import Sandbox
from sandboxes.selectors import node_is_alive
from sandboxes.services import nodes_reap
from tests.billing.ledger import ledger_event
from tests.conftest import HARNESS, PAW_AGENT, SCRIPTED_API_KEY
from tests.factories import ConversationFactory
from tests.live import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

ROUND_USAGE = {"prompt_tokens": 100, "completion_tokens": 10}  # 110 tokens per model call
TITLE = {"text": "Title", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
LIST_FILES = {"tool_calls": [{"name": "list_files", "arguments": {}}], "usage": ROUND_USAGE}
SLOW_TEXT = {"text": "x" * 600, "chunk": 2, "chunk_delay": 0.05, "usage": ROUND_USAGE}
# A model that asks for list_files forever (a little slowly, so PAW's cancel lands mid-run
# rather than after the runtime's own round limit).
LOOP = {"api_key": SCRIPTED_API_KEY, "untooled": TITLE, "fallback": {**LIST_FILES, "delay": 0.3}}


def finished(run_id) -> Run | None:
    return Run.objects.filter(id=run_id, status__in=Run.FINISHED_STATUSES).first()


def tokens(usage: dict) -> int:
    return usage["input"] + usage["output"]


def last_running_totals(run) -> dict:
    event = RunEvent.objects.filter(run=run, type="notify", kind="usage").order_by("-cursor")[0]
    return event.payload["data"]


def assert_billed_as_run(run: Run) -> UsageEvent:
    """The run has exactly one ledger row, carrying its usage and attribution."""
    (event,) = UsageEvent.objects.filter(run=run)
    assert (event.input_tokens, event.output_tokens, event.rounds) == (
        run.usage["input"],
        run.usage["output"],
        run.usage["rounds"],
    )
    assert event.user_id == run.user_id and event.conversation_id == run.conversation_id
    assert (event.provider, event.model, event.run_status) == (run.provider, run.model, run.status)
    return event


def test_a_done_run_is_billed_once_and_a_retried_finish_changes_nothing(
    celery_worker, scripted_model
):
    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "untooled": TITLE, "responses": [LIST_FILES, "Done."]}
    )
    conversation = ConversationFactory()
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="List them.")
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.DONE, run.errors
    event = assert_billed_as_run(run)
    assert event.rounds >= 2 and event.tokens >= 220
    assert (event.provider, event.model) == ("default", "scripted-model")

    # A finish that is retried (or raced by the reaper) is a no-op; so is a second record.
    run_finish(run_id=run.id, status=Run.Status.ERROR, usage={"input": 10**6, "output": 1})
    usage_record(run=Run.objects.get(id=run.id))
    assert UsageEvent.objects.filter(run=run).count() == 1
    assert UsageEvent.objects.get(run=run).tokens == event.tokens


def test_a_cancelled_run_is_billed_for_the_rounds_it_used(celery_worker, scripted_model):
    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "untooled": TITLE, "responses": [LIST_FILES, SLOW_TEXT]}
    )
    conversation = ConversationFactory()
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="List, then talk."
    )
    wait_for(lambda: RunEvent.objects.filter(run=run, type="delta").count() >= 3, what="deltas")
    run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.CANCELLED
    event = assert_billed_as_run(run)
    # At least the finished list_files round (110 tokens) is billed.
    assert event.input_tokens >= 100 and event.output_tokens >= 10 and event.rounds >= 1
    assert event.tokens >= tokens(last_running_totals(run))


def test_a_crashed_run_is_billed_with_its_last_running_totals(celery_worker, scripted_model):
    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "untooled": TITLE, "responses": [LIST_FILES, SLOW_TEXT]}
    )
    conversation = ConversationFactory()
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Then die.")
    wait_for(
        lambda: (
            RunEvent.objects.filter(run=run, type="delta").exists()
            and RunEvent.objects.filter(run=run, type="notify", kind="usage").exists()
        ),
        what="a usage line and the stream",
    )
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    os.kill(sandbox.pid, signal.SIGKILL)
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.ERROR
    assert run.errors[0]["code"] == "sandbox_exited"
    reported = last_running_totals(run)
    assert tokens(reported) >= 110
    assert {k: run.usage[k] for k in ("input", "output", "rounds")} == {
        k: reported[k] for k in ("input", "output", "rounds")
    }
    assert assert_billed_as_run(run).tokens == tokens(reported)


def test_a_model_looping_on_tools_is_stopped_past_the_users_run_budget(
    celery_worker, scripted_model
):
    scripted_model.load(LOOP)
    conversation = ConversationFactory()
    Budget.objects.create(user=conversation.user, run_tokens=250)
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Loop.")
    run = wait_for(lambda: finished(run.id), timeout=30, what="the run to be stopped")
    assert run.status == Run.Status.ERROR, run.errors
    assert run.errors[0]["code"] == "budget_exceeded", run.errors
    assert "250 tokens per run" in run.errors[0]["message"]
    event = assert_billed_as_run(run)
    assert event.tokens > 250  # billed for what it used, past the limit
    assert event.rounds < 10  # stopped long before the runtime's own round limit
    assert event.run_status == Run.Status.ERROR


def test_a_run_is_stopped_once_the_monthly_budget_is_passed(celery_worker, scripted_model):
    scripted_model.load(LOOP)
    conversation = ConversationFactory()
    user = conversation.user
    Budget.objects.create(user=user, monthly_tokens=500, run_tokens=0)
    ledger_event(user=user, input_tokens=250, output_tokens=50)  # 300 used this month
    run = run_start(user=user, conversation_id=conversation.id, prompt="Loop.")
    run = wait_for(lambda: finished(run.id), timeout=30, what="the run to be stopped")
    assert run.status == Run.Status.ERROR, run.errors
    assert run.errors[0]["code"] == "budget_exceeded", run.errors
    assert "monthly token budget of 500 tokens" in run.errors[0]["message"]
    event = assert_billed_as_run(run)
    assert 300 + event.tokens > 500
    assert event.rounds < 10


def test_the_server_run_budget_setting_stops_a_looping_run(worker_node, scripted_model):
    worker_node.use(PAW_AGENT, PAW_BUDGET_RUN_TOKENS="300")
    scripted_model.load(LOOP)
    conversation = ConversationFactory()
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Loop.")
    run = wait_for(lambda: finished(run.id), timeout=30, what="the run to be stopped")
    assert run.status == Run.Status.ERROR, run.errors
    assert run.errors[0]["code"] == "budget_exceeded", run.errors
    assert "300 tokens per run" in run.errors[0]["message"]
    assert assert_billed_as_run(run).tokens > 300


# --- No run that used the model is billed zero (issue 14, point 6) ------------------------

#: A first answer streamed slowly (~15 s) whose usage would come only at its end.
LONG_STREAM = {"text": "x" * 600, "chunk": 2, "chunk_delay": 0.05, "usage": ROUND_USAGE}
REMEMBER = "Remember: the code is 4711."


def streamed_chars(run) -> int:
    return sum(
        len(text)
        for text in RunEvent.objects.filter(run=run, type="delta").values_list(
            "payload__text", flat=True
        )
    )


def conversation_with_a_turn(scripted_model):
    """A conversation with one finished exchange (the history its runtime carries), and the
    scripted model loaded to stream the next answer slowly."""
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": TITLE, "fallback": "Noted."})
    conversation = ConversationFactory()
    first = run_start(user=conversation.user, conversation_id=conversation.id, prompt=REMEMBER)
    assert wait_for(lambda: finished(first.id), what="the first run").status == Run.Status.DONE
    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "untooled": TITLE, "responses": [LONG_STREAM]}
    )
    return conversation


def start_streaming(conversation, prompt: str) -> Run:
    """Start ``prompt`` and return once it has streamed a few deltas and reported no usage."""
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt=prompt)
    wait_for(lambda: RunEvent.objects.filter(run=run, type="delta").count() >= 5, what="deltas")
    assert not RunEvent.objects.filter(run=run, type="notify", kind="usage").exists()
    return run


def assert_billed_an_estimate(run: Run, prompt: str, *, history: bool = True) -> UsageEvent:
    """The run's one ledger row is the estimate from its prompt, the history it carried
    (the first exchange, with ``history``) and the text it streamed."""
    event = assert_billed_as_run(run)
    sent = len(prompt) + (len(REMEMBER) + len("Noted.") if history else 0)
    assert event.estimated is True and run.usage["estimated"] is True
    assert event.input_tokens == estimate_tokens(sent)
    assert event.output_tokens == estimate_tokens(streamed_chars(run)) > 0
    assert event.rounds == 1
    return event


def test_a_run_cancelled_mid_stream_before_any_usage_is_billed_an_estimate(
    celery_worker, scripted_model
):
    conversation = conversation_with_a_turn(scripted_model)
    run = start_streaming(conversation, "Tell me a story.")
    run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.CANCELLED
    assert_billed_an_estimate(run, "Tell me a story.")


def test_a_run_crashed_mid_stream_before_any_usage_is_billed_an_estimate(
    celery_worker, scripted_model
):
    conversation = conversation_with_a_turn(scripted_model)
    run = start_streaming(conversation, "Stream, then die.")
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    os.kill(sandbox.pid, signal.SIGKILL)
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.ERROR and run.errors[0]["code"] == "sandbox_exited"
    assert_billed_an_estimate(run, "Stream, then die.")


def test_a_run_past_its_time_limit_mid_stream_is_billed_an_estimate(worker_node, scripted_model):
    worker_node.use(PAW_AGENT, PAW_RUN_TIMEOUT_SECONDS="4")
    conversation = conversation_with_a_turn(scripted_model)
    run = start_streaming(conversation, "Take too long.")
    run = wait_for(lambda: finished(run.id), timeout=30, what="the run to time out")
    assert run.status == Run.Status.ERROR and run.errors[0]["code"] == "timeout", run.errors
    assert_billed_an_estimate(run, "Take too long.")


def test_a_run_lost_with_its_worker_mid_stream_is_billed_an_estimate_by_the_reaper(
    worker_node, scripted_model, settings
):
    worker_node.use(PAW_AGENT)
    conversation = conversation_with_a_turn(scripted_model)
    run = start_streaming(conversation, "Stream, then lose the worker.")
    os.kill(worker_node.process.pid, signal.SIGKILL)
    worker_node.process.wait(timeout=10)
    settings.PAW_NODE_DEAD_SECONDS = 1
    try:
        wait_for(lambda: not node_is_alive(worker_node.name), what="the node to count as lost")
        assert nodes_reap()["runs"] == 1
        run = Run.objects.get(id=run.id)
        assert run.status == Run.Status.ERROR and run.errors[0]["code"] == "worker_lost"
        event = assert_billed_an_estimate(run, "Stream, then lose the worker.")
        assert nodes_reap()["runs"] == 0  # exactly once
        assert UsageEvent.objects.filter(run=run).count() == 1
        assert UsageEvent.objects.get(run=run).tokens == event.tokens
    finally:
        worker_node.stop()  # the next test starts a fresh worker


@pytest.mark.parametrize("runtime", [PAW_AGENT, HARNESS], ids=["paw-agent", "harness"])
def test_a_run_of_either_runtime_cancelled_mid_stream_is_billed_once_never_zero(
    worker_node, runtime, scripted_model
):
    worker_node.use(runtime)
    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "untooled": TITLE, "responses": [LONG_STREAM]}
    )
    conversation = ConversationFactory()
    run = start_streaming(conversation, "Tell me a story.")
    run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.CANCELLED
    # Neither runtime reports usage for an answer cut off mid-stream: PAW estimates it.
    assert_billed_an_estimate(run, "Tell me a story.", history=False)
