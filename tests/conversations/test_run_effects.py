"""What stored runtime lines do to their run (``conversations/services/run_effects.py``),
with the real paw-agent runtime: an ask becomes an approval, a declined gated action never
happens, an approved one happens once, auto-approve lets it through, and none of them is
mistaken for a policy violation. (A ``result`` billing its run and usage past a budget
stopping it: ``tests/billing/test_ledger_runtime.py``.)"""

from __future__ import annotations

import pytest

from conversations.models import Approval, Run, RunEvent
from conversations.services.approvals import approval_decide
from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from tests.conftest import SCRIPTED_API_KEY
from tests.factories import ConversationFactory
from tests.live import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def delete_script(path: str) -> dict:
    return {
        "api_key": SCRIPTED_API_KEY,
        "responses": [
            {"tool_calls": [{"name": "delete_file", "arguments": {"path": path}}]},
            "Finished: {{tool_result}}",
        ],
    }


def finished(run_id) -> Run | None:
    return Run.objects.filter(id=run_id, status__in=Run.FINISHED_STATUSES).first()


def pending(conversation) -> Approval:
    return wait_for(
        lambda: Approval.objects.filter(
            conversation=conversation, status=Approval.Status.PENDING
        ).first(),
        what="the confirm",
    )


@pytest.mark.parametrize("approved", [False, True], ids=["declined", "approved"])
def test_a_gated_delete_happens_only_when_approved(celery_worker, scripted_model, approved):
    scripted_model.load(delete_script("keep.txt"))
    conversation = ConversationFactory()
    target = workspace_ensure(conversation.id) / "keep.txt"
    target.write_text("precious")
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="Delete keep.txt"
    )
    approval = pending(conversation)
    assert approval.kind == Approval.Kind.CONFIRM
    assert "keep.txt" in approval.prompt
    assert target.exists()  # nothing happens while the person decides
    approval_decide(approval_id=approval.id, user=conversation.user, approved=approved)
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.DONE, run.errors
    assert target.exists() is not approved
    if not approved:
        assert "declined by the user" in run.answer
    events = RunEvent.objects.filter(run=run)
    assert not events.filter(type="policy_violation").exists()
    calls = [e.payload["data"] for e in events.filter(type="notify", kind="tool_calls")]
    assert calls == (
        [[{"name": "delete_file", "args": {"path": "'keep.txt'"}, "input": {"path": "keep.txt"}}]]
        if approved
        else []
    )


def test_auto_approve_lets_a_gated_action_run_without_asking(celery_worker, scripted_model):
    scripted_model.load(delete_script("old.txt"))
    conversation = ConversationFactory(auto_approve=True)
    target = workspace_ensure(conversation.id) / "old.txt"
    target.write_text("old")
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="Delete old.txt"
    )
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.DONE, run.errors
    assert not target.exists()
    approval = Approval.objects.get(run=run)
    assert (approval.status, approval.decided_by) == ("approved", "auto")
    assert not RunEvent.objects.filter(run=run, type="policy_violation").exists()
