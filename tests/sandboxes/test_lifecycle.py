"""Runs through real workers and real runtime processes against the scripted model."""

from __future__ import annotations

import pytest

from conversations.models import Run, RunEvent
from conversations.services.runs import run_start
from sandboxes.models import Sandbox
from tests.conftest import HARNESS, PAW_AGENT
from tests.factories import ConversationFactory
from tests.live import GroupListener, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture(params=[PAW_AGENT, HARNESS], ids=["paw-agent", "harness"], scope="module")
def runtime(request):
    return request.param


@pytest.fixture
def worker(worker_node, runtime):
    return worker_node.use(runtime)


def finished(run_id):
    run = Run.objects.get(id=run_id)
    return run if run.status in Run.FINISHED_STATUSES else None


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
