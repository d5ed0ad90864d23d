"""A runtime that cannot be gated (issue 25, part 2): python-agent-harness runs its tools
itself and tells the host only afterwards, so PAW must not promise approvals there. A
runtime whose ``ready`` lacks ``approval_gate`` is *ungated*: PAW runs it only when the
operator set ``PAW_ALLOW_UNGATED_RUNTIME``, every conversation on it is told so at its
first run there (a ``notice``, and ``runtime_gated: false`` on each run in the API), and
a violation says the call "ran without asking". Through real workers, the real
python-agent-harness package and paw-agent, against the scripted model."""

from __future__ import annotations

import pytest
from django.conf import settings

from conversations.models import Approval, Run, RunEvent
from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from sandboxes.enqueue import sandbox_stop_enqueue
from sandboxes.models import Sandbox
from sandboxes.services import UNGATED_NOTICE
from tests.conftest import HARNESS, PAW_AGENT, SCRIPTED_API_KEY, api_client_for
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.processes import worker_database_url
from tests.sandboxes.conftest import ExtraWorkerNode
from tests.sandboxes.observe import finished, marked_processes
from tests.sandboxes.scenarios import FAKE, start_with_mode

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

#: The words the issue asks every conversation on an ungated runtime to be told.
TOLD = "This runtime runs its tools without asking; approvals apply to paw-agent only."
APPEND = {"tool_calls": [{"name": "Bash", "arguments": {"command": "echo x >> count.txt"}}]}


def notices(conversation) -> list[RunEvent]:
    return list(
        RunEvent.objects.filter(conversation=conversation, type="notice", kind="runtime_ungated")
    )


def run_of_api(run: Run) -> dict:
    response = api_client_for(run.user).get(
        f"/api/conversations/{run.conversation_id}/runs/{run.id}"
    )
    assert response.status_code == 200, response.content
    return response.json()


def test_a_harness_call_that_needed_an_approval_ran_without_asking_and_the_message_says_so(
    worker_node, scripted_model
):
    """The issue's reproduction: python-agent-harness's ``Bash`` appends to count.txt. PAW
    asks nothing (the harness cannot be asked), ends the run with ``policy_violation``,
    and says what happened — the call ran without asking — instead of "stopped"."""
    worker_node.use(HARNESS)  # with PAW_ALLOW_UNGATED_RUNTIME=1 (tests/conftest.py)
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title",
                         "responses": [APPEND, "Appended."], "fallback": "Done."})  # fmt: skip
    conversation = ConversationFactory()
    count = workspace_ensure(conversation.id) / "count.txt"
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="Append x to count.txt."
    )
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.ERROR, run.errors
    (error,) = run.errors
    assert error["code"] == "policy_violation"
    assert "Bash call ran without asking" in error["message"]
    assert "stopped" not in error["message"]
    (event,) = RunEvent.objects.filter(run=run, type="policy_violation")
    assert event.payload["message"] == error["message"] and event.payload["tools"] == ["Bash"]
    assert count.read_text() == "x\n"  # why: the harness ran it before PAW heard of it
    assert not Approval.objects.filter(run=run).exists()
    (notice,) = notices(conversation)
    assert notice.run_id == run.id
    assert notice.payload["message"].startswith(TOLD)
    assert notice.payload["message"] == UNGATED_NOTICE
    assert run.runtime_gated is False
    assert run_of_api(run)["runtime_gated"] is False
    listed = api_client_for(conversation.user).get(f"/api/conversations/{conversation.id}/events")
    shown = [e for e in listed.json()["events"] if e["type"] == "notice"]
    assert [(e["kind"], e["run_id"], e["event"]["message"]) for e in shown] == [
        ("runtime_ungated", str(run.id), UNGATED_NOTICE)
    ]


def test_every_conversation_on_an_ungated_runtime_is_told_once_at_its_first_run(
    worker_node, scripted_model
):
    """At the first run of each conversation on the harness; not again at its next run,
    nor when its sandbox is started anew (an idle shutdown, a stop)."""
    worker_node.use(HARNESS)
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Noted."})
    first, other = ConversationFactory(), ConversationFactory()
    runs = []
    for conversation in (first, other, first):
        run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Hi.")
        runs.append(wait_for(lambda run=run: finished(run.id), what="the run to end"))
    sandbox = Sandbox.objects.get(conversation=first, state__in=Sandbox.LIVE_STATES)
    sandbox_stop_enqueue(conversation_id=first.id, node=sandbox.node)
    wait_for(
        lambda: Sandbox.objects.filter(id=sandbox.id, state=Sandbox.State.STOPPED).exists(),
        what="the sandbox to stop",
    )
    again = run_start(user=first.user, conversation_id=first.id, prompt="Hi again.")
    runs.append(wait_for(lambda: finished(again.id), what="the run to end"))
    assert [r.status for r in runs] == [Run.Status.DONE] * 4, [r.errors for r in runs]
    assert Sandbox.objects.filter(conversation=first).count() == 2  # a new process
    assert [n.run_id for n in notices(first)] == [runs[0].id]
    assert [n.run_id for n in notices(other)] == [runs[1].id]
    assert [run_of_api(r)["runtime_gated"] for r in runs] == [False] * 4


def test_a_conversation_back_on_an_ungated_runtime_after_a_gated_one_is_told_again(
    worker_node, scripted_model
):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Noted."})
    conversation = ConversationFactory()
    runs = []
    for command in (HARNESS, PAW_AGENT, HARNESS):
        worker_node.use(command)  # a new worker: the conversation gets a new sandbox
        run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Hi.")
        runs.append(wait_for(lambda run=run: finished(run.id), what="the run to end"))
    assert [r.status for r in runs] == [Run.Status.DONE] * 3, [r.errors for r in runs]
    assert [r.runtime_gated for r in runs] == [False, True, False]
    assert [n.run_id for n in notices(conversation)] == [runs[0].id, runs[2].id]


def test_paw_agent_is_gated_and_nobody_is_warned(worker_node, scripted_model):
    worker_node.use(PAW_AGENT)
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Hello."})
    conversation = ConversationFactory()
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Hi.")
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.DONE, run.errors
    assert "approval_gate" in Sandbox.objects.get(conversation=conversation).capabilities
    assert run_of_api(run)["runtime_gated"] is True
    assert notices(conversation) == []


def test_an_ungated_runtime_is_not_run_unless_the_operator_accepts_it(worker_node):
    """Without PAW_ALLOW_UNGATED_RUNTIME a runtime whose ready offers no approval_gate (the
    fake one: a program PAW cannot judge before its ready) is refused at its start: the
    run fails with the reason, nothing ran, no process is left; the worker said at its
    start what such a runtime must offer."""
    node = worker_node.use(
        FAKE,
        PAW_SANDBOX_ISOLATION="none",
        PAW_SANDBOX_READY_TIMEOUT="3",
        PAW_ALLOW_UNGATED_RUNTIME="0",
    )
    conversation, run = start_with_mode("flood 3")
    run = wait_for(lambda: finished(run.id), what="the run to be refused")
    assert run.status == Run.Status.ERROR
    (error,) = run.errors
    assert error["code"] == "runtime_ungated"
    assert "runs its tools without asking" in error["message"]
    assert "PAW_ALLOW_UNGATED_RUNTIME=1" in error["message"]
    assert not RunEvent.objects.filter(run=run, type__in=["start", "delta"]).exists()
    (sandbox,) = Sandbox.objects.filter(conversation=conversation)
    assert sandbox.state == Sandbox.State.DEAD
    assert wait_for(lambda: marked_processes(sandbox.id) == [], what="no process left")
    assert "sandboxes start only if its ready offers approval_gate" in node.output()
    assert notices(conversation) == []


def test_a_worker_running_python_agent_harness_refuses_to_start_without_the_setting(
    django_db_blocker, scripted_model
):
    """python-agent-harness is known to be ungated (docs/runtime.md): a node naming it
    does not start at all unless the operator accepted that, like a node that cannot
    isolate its sandboxes."""
    with django_db_blocker.unblock():
        node = ExtraWorkerNode(
            worker_database_url(), scripted_model, name=f"{settings.PAW_NODE_NAME}-ungated"
        )
    try:
        with pytest.raises(RuntimeError, match="did not start") as refused:
            node.use(HARNESS, PAW_ALLOW_UNGATED_RUNTIME="0")
        assert "PAW_HARNESS_CMD runs python-agent-harness" in str(refused.value)
        assert "PAW_ALLOW_UNGATED_RUNTIME=1" in str(refused.value)
    finally:
        node.stop()
