"""The ledger without a worker: every way a run ends writes exactly one row, runs lost
with their worker are billed from their stored running totals, a result that
under-reports is billed for what was seen, and deleting a conversation gives no tokens
back."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import UsageEvent
from billing.selectors import budget_status
from billing.services import estimate_tokens, usage_merge, usage_normalize
from conversations.models import Run
from conversations.services.conversations import conversation_delete
from conversations.services.events import EventDraft, events_append
from conversations.services.run_effects import result_outcome
from conversations.services.runs import run_cancel, run_fail, run_finish
from sandboxes.models import WorkerNode
from sandboxes.services import nodes_reap
from tests.factories import ConversationFactory

pytestmark = pytest.mark.django_db


def running_run(conversation, **fields) -> Run:
    return Run.objects.create(
        conversation=conversation,
        user=conversation.user,
        prompt="p",
        status=Run.Status.RUNNING,
        provider="default",
        model="m-1",
        **fields,
    )


def report_usage(run: Run, **totals) -> None:
    """Store a ``notify usage`` line of the run, as the pipeline does."""
    events_append(
        conversation_id=run.conversation_id,
        drafts=[
            EventDraft(
                run_id=run.id,
                type="notify",
                kind="usage",
                payload={"type": "notify", "kind": "usage", "data": totals},
            )
        ],
    )


def test_a_queued_run_cancelled_at_once_gets_one_zero_row():
    conversation = ConversationFactory()
    run = Run.objects.create(conversation=conversation, user=conversation.user, prompt="p")
    run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=run.id)
    event = UsageEvent.objects.get(run=run)
    assert (event.tokens, event.rounds, event.run_status) == (0, 0, "cancelled")
    assert Run.objects.get(id=run.id).usage == {
        "input": 0,
        "output": 0,
        "rounds": 0,
        "estimated": False,
    }


def test_a_finish_with_usage_is_billed_once_with_its_attribution():
    conversation = ConversationFactory()
    run = running_run(conversation)
    usage = {"input": 1200, "output": 34, "rounds": 3, "estimated": True}
    run_finish(run_id=run.id, status=Run.Status.DONE, model="m-2", usage=usage)
    run_finish(run_id=run.id, status=Run.Status.DONE, usage={"input": 5, "output": 5})
    run_fail(run_id=run.id, code="worker_lost", message="late")
    (event,) = UsageEvent.objects.all()
    assert (event.input_tokens, event.output_tokens, event.rounds, event.estimated) == (
        1200,
        34,
        3,
        True,
    )
    assert (event.user, event.conversation_id, event.run_id) == (
        conversation.user,
        conversation.id,
        run.id,
    )
    assert (event.provider, event.model, event.run_status) == ("default", "m-2", "done")


def test_a_run_lost_with_its_worker_is_billed_for_its_last_reported_totals():
    conversation = ConversationFactory()
    WorkerNode.objects.create(name="ghost", heartbeat_at=timezone.now() - timedelta(hours=1))
    run = running_run(conversation, node="ghost")
    report_usage(run, input=100, output=10, rounds=1)
    report_usage(run, input=450, output=25, rounds=2)
    assert nodes_reap()["runs"] == 1
    run.refresh_from_db()
    assert run.status == Run.Status.ERROR and run.errors[0]["code"] == "worker_lost"
    assert run.usage == {"input": 450, "output": 25, "rounds": 2, "estimated": False}
    assert UsageEvent.objects.get(run=run).tokens == 475


def test_a_result_that_under_reports_is_billed_for_the_running_totals_seen():
    running = {"input": 300, "output": 30, "rounds": 2, "estimated": False}
    assert usage_merge({"input": 0, "output": 0, "rounds": 0}, running) == running
    assert usage_merge({"input": 400, "output": 5, "rounds": 2, "estimated": True}, running) == {
        "input": 400,
        "output": 30,
        "rounds": 2,
        "estimated": True,
    }
    assert usage_merge({"input": 7, "output": 1, "rounds": 1}, None)["input"] == 7
    # The runtime is untrusted: nothing but non-negative integers counts.
    assert usage_normalize({"input": -5, "output": "9", "rounds": True, "estimated": 1}) == {
        "input": 0,
        "output": 0,
        "rounds": 0,
        "estimated": True,
    }
    outcome = result_outcome({"cancelled": True, "usage": {"input": 12, "output": 3}}, None)
    assert outcome["usage"] == {"input": 12, "output": 3, "rounds": 0, "estimated": False}


def test_deleting_a_conversation_keeps_its_tokens_in_the_ledger_and_the_budget():
    conversation = ConversationFactory(title="Gone soon")
    user = conversation.user
    run = running_run(conversation)
    run_finish(run_id=run.id, status=Run.Status.DONE, usage={"input": 700, "output": 7})
    conversation_delete(user=user, conversation_id=conversation.id)
    event = UsageEvent.objects.get(user=user)
    assert (event.conversation_id, event.run_id, event.tokens) == (None, None, 707)
    assert budget_status(user_id=user.pk)["used_this_month"] == 707


def stream(run: Run, *texts: str) -> None:
    """Store ``delta`` events of the run, as the pipeline does."""
    events_append(
        conversation_id=run.conversation_id,
        drafts=[
            EventDraft(run_id=run.id, type="delta", payload={"type": "delta", "text": text})
            for text in texts
        ],
    )


def test_a_run_lost_with_its_worker_before_any_usage_is_billed_an_estimate_once():
    conversation = ConversationFactory()
    earlier = running_run(conversation)
    earlier.prompt = "What is the code?" * 10
    earlier.save(update_fields=["prompt"])
    run_finish(run_id=earlier.id, status=Run.Status.DONE, answer="4711. " * 50, usage={"input": 9})
    WorkerNode.objects.create(name="ghost", heartbeat_at=timezone.now() - timedelta(hours=1))
    run = running_run(conversation, node="ghost")
    Run.objects.filter(id=run.id).update(prompt="Tell me a long story. " * 30)
    stream(run, "Once upon " * 20, "a time " * 30)
    assert nodes_reap()["runs"] == 1
    run.refresh_from_db()
    assert run.status == Run.Status.ERROR and run.errors[0]["code"] == "worker_lost"
    sent = len("Tell me a long story. " * 30) + len("What is the code?" * 10) + len("4711. " * 50)
    streamed = len("Once upon " * 20) + len("a time " * 30)
    expected = {
        "input": estimate_tokens(sent),
        "output": estimate_tokens(streamed),
        "rounds": 1,
        "estimated": True,
    }
    assert run.usage == expected and expected["output"] == 118  # 410 characters
    event = UsageEvent.objects.get(run=run)
    assert (event.input_tokens, event.output_tokens, event.estimated) == (
        expected["input"],
        expected["output"],
        True,
    )
    # Exactly once: a late result, a retried reap or cancel change nothing.
    run_finish(run_id=run.id, status=Run.Status.CANCELLED, usage={"input": 10**6})
    assert nodes_reap()["runs"] == 0
    assert UsageEvent.objects.filter(run=run).count() == 1
    assert UsageEvent.objects.get(run=run).tokens == event.tokens


def test_reported_totals_win_over_an_estimate_and_a_run_that_did_not_use_the_model_is_zero():
    conversation = ConversationFactory()
    reported = running_run(conversation)
    stream(reported, "x" * 7000)
    report_usage(reported, input=40, output=2, rounds=1)
    run_fail(run_id=reported.id, code="sandbox_exited", message="sandbox exited (code -9)")
    assert Run.objects.get(id=reported.id).usage == {
        "input": 40,
        "output": 2,
        "rounds": 1,
        "estimated": False,
    }
    # Never acknowledged by a runtime (the sandbox did not start): nothing was sent.
    starting = Run.objects.create(
        conversation=ConversationFactory(),
        user=conversation.user,
        prompt="p" * 1000,
        status=Run.Status.STARTING,
    )
    run_fail(run_id=starting.id, code="sandbox_start", message="the runtime did not start")
    assert UsageEvent.objects.get(run=starting).tokens == 0
    # The provider refused the credentials at once: nothing was used either.
    refused = running_run(ConversationFactory(user=conversation.user))
    run_finish(
        run_id=refused.id,
        status=Run.Status.ERROR,
        errors=[{"code": "auth", "message": "401"}],
        usage={"input": 0, "output": 0, "rounds": 0},
    )
    assert UsageEvent.objects.get(run=refused).tokens == 0
    # A model call that failed for good before any text: the provider answered nothing.
    failed = running_run(ConversationFactory(user=conversation.user))
    run_finish(
        run_id=failed.id,
        status=Run.Status.ERROR,
        errors=[{"code": "unknown", "message": "model call failed after 3 attempts"}],
        usage={"input": 0, "output": 0, "rounds": 0},
    )
    assert UsageEvent.objects.get(run=failed).tokens == 0
    # … but one that failed after streaming text did use the model.
    cut = running_run(ConversationFactory(user=conversation.user))
    stream(cut, "z" * 70)
    run_finish(
        run_id=cut.id,
        status=Run.Status.ERROR,
        errors=[{"code": "unknown", "message": "connection lost"}],
        usage={"input": 0, "output": 0, "rounds": 0},
    )
    event = UsageEvent.objects.get(run=cut)
    assert (event.input_tokens, event.output_tokens, event.estimated) == (1, 20, True)


def test_a_result_reporting_zero_tokens_after_a_stream_is_billed_an_estimate():
    conversation = ConversationFactory()
    run = running_run(conversation)
    stream(run, "y" * 350)
    run_finish(run_id=run.id, status=Run.Status.CANCELLED, usage={"input": 0, "output": 0})
    event = UsageEvent.objects.get(run=run)
    assert (event.input_tokens, event.output_tokens, event.rounds, event.estimated) == (
        estimate_tokens(1),
        100,
        1,
        True,
    )


def test_a_run_of_the_offline_demo_is_marked_demo_usage_in_the_ledger():
    conversation = ConversationFactory()
    demo = running_run(conversation)
    Run.objects.filter(id=demo.id).update(provider="demo", model="scripted-demo")
    run_finish(run_id=demo.id, status=Run.Status.DONE, usage={"input": 400, "output": 20})
    other = running_run(ConversationFactory(user=conversation.user))
    run_finish(run_id=other.id, status=Run.Status.DONE, usage={"input": 7, "output": 3})
    rows = {e.provider: (e.demo, e.tokens) for e in UsageEvent.objects.all()}
    assert rows == {"demo": (True, 420), "default": (False, 10)}
    # Listed like any other run, never counted against a budget.
    assert budget_status(user_id=conversation.user_id)["used_this_month"] == 10
