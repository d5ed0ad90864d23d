"""An approval allows exactly the call it was asked for (issue 14, point 2): a gated call
runs only under an approved confirm of the same run naming that call (tool and exact
arguments), each approval allowing one call once; gated names are matched whatever their
case and surrounding space; a runtime that does not ask is stopped when it announces the
call. With both real runtimes (paw-agent asks; python-agent-harness never does) and the
deliberately rogue fake runtime."""

from __future__ import annotations

import pytest

from conversations.models import Approval, Run, RunEvent
from conversations.selectors.messages import approval_request_message
from conversations.services.approvals import approval_decide, call_key, tool_name_key
from conversations.services.run_effects import gated_calls_of
from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from tests.conftest import HARNESS, PAW_AGENT, SCRIPTED_API_KEY, api_client_for
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.observe import finished
from tests.sandboxes.scenarios import start_with_mode

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TITLE = {"text": "Title"}


def pending(conversation, *, after: set | frozenset = frozenset()) -> Approval:
    """The next pending approval of ``conversation`` (not one of the ids ``after``)."""
    return wait_for(
        lambda: (
            Approval.objects.filter(conversation=conversation, status=Approval.Status.PENDING)
            .exclude(id__in=after)
            .first()
        ),
        what="a confirm",
    )


def violation(run: Run) -> dict:
    (event,) = RunEvent.objects.filter(run=run, type="policy_violation")
    return event.payload


# --- the rules, without a runtime ---------------------------------------------------------


@pytest.mark.django_db
def test_gated_names_match_whatever_their_case_and_surrounding_space(settings):
    settings.PAW_APPROVAL_REQUIRED_TOOLS = [" SHELL ", "bash", ""]
    calls = [
        {"name": "shell"},
        {"name": " Shell\t"},
        {"name": "BASH"},
        {"name": "Bash "},
        {"name": "run_python"},
        {"name": None},
        "shell",
    ]
    assert [c["name"] for c in gated_calls_of(calls)] == ["shell", " Shell\t", "BASH", "Bash "]
    assert tool_name_key(" Bash\n") == tool_name_key("bash") == "bash"


def test_the_default_gated_tools_are_the_mutating_tools_of_both_runtimes(settings):
    from python_agent_harness.tools import AgentTool, Bash, Edit, Write

    from paw_agent.tools import GATED

    defaults = {tool_name_key(name) for name in settings.PAW_APPROVAL_REQUIRED_TOOLS}
    harness = {tool.name for tool in (Bash(), Write(), Edit(), AgentTool())}
    assert harness == {"Bash", "Write", "Edit", "Agent"}  # the harness's own spelling
    assert {tool_name_key(name) for name in (*GATED, *harness)} <= defaults


def test_a_call_key_is_the_tool_and_its_exact_arguments():
    harmless = {"name": "shell", "args": {"command": "'echo harmless'"}}
    assert call_key(harmless) == call_key(
        {"args": {"command": "'echo harmless'"}, "name": " SHELL"}
    )
    assert call_key(harmless) != call_key(
        {"name": "shell", "args": {"command": "'echo harmless '"}}
    )
    assert call_key(harmless) != call_key({**harmless, "input": {"command": "echo harmless"}})
    assert call_key(harmless) != call_key({**harmless, "name": "delete_file"})
    assert call_key("shell") is None


# --- a rogue runtime ------------------------------------------------------------------------


def test_an_approval_of_one_call_does_not_let_another_one_run(fake_worker):
    conversation, run = start_with_mode("rogue swap")
    approval = pending(conversation)
    assert approval.call["input"] == {"command": "echo harmless"}
    # The person is shown the call the approval allows (the tabs and the API).
    assert approval_request_message(approval)["call"] == approval.call
    listed = api_client_for(conversation.user).get(
        f"/api/conversations/{conversation.id}/approvals", {"status": "pending"}
    )
    assert [a["call"] for a in listed.json()["results"]] == [approval.call]
    approval_decide(approval_id=approval.id, user=conversation.user, approved=True)
    run = wait_for(lambda: finished(run.id), what="the run to be stopped")
    assert run.status == Run.Status.ERROR, run.errors
    assert run.errors[0]["code"] == "policy_violation"
    assert violation(run)["tools"] == ["shell"]
    assert "exact call" in violation(run)["message"]
    announced = RunEvent.objects.get(run=run, type="notify", kind="tool_calls")
    assert announced.payload["data"][0]["input"] == {"command": "echo REALLY-DANGEROUS"}
    approval.refresh_from_db()
    assert approval.status == Approval.Status.APPROVED and approval.used_at is None


def test_one_approval_allows_one_call_once(fake_worker):
    conversation, run = start_with_mode("rogue reuse")
    approval = pending(conversation)
    approval_decide(approval_id=approval.id, user=conversation.user, approved=True)
    run = wait_for(lambda: finished(run.id), what="the run to be stopped")
    assert run.status == Run.Status.ERROR and run.errors[0]["code"] == "policy_violation"
    calls = RunEvent.objects.filter(run=run, type="notify", kind="tool_calls").order_by("cursor")
    assert [c.payload["data"][0]["input"]["command"] for c in calls] == ["echo harmless"] * 2
    assert violation(run)["tools"] == ["shell"]
    approval.refresh_from_db()
    assert approval.used_at is not None  # the first call used it; the second had none


@pytest.mark.parametrize("name", ["SHELL", "_Shell_", "Bash", "bash", "_Write", "Edit", "Agent"])
def test_a_gated_call_without_asking_is_stopped_whatever_the_spelling(fake_worker, name):
    _conversation, run = start_with_mode(f"lying {name}")
    run = wait_for(lambda: finished(run.id), what="the run to be stopped")
    assert run.status == Run.Status.ERROR and run.errors[0]["code"] == "policy_violation"
    assert violation(run)["tools"] == [name.replace("_", " ")]
    assert not Approval.objects.filter(run=run).exists()


def test_a_gated_call_read_with_the_runs_result_still_ends_it_as_a_violation(fake_worker):
    """The call and the result arrive together (one batch of the pipeline): the run must
    not end ``done`` before the host's stop could reach the runtime."""
    _conversation, run = start_with_mode("blurt")
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.ERROR, (run.status, run.answer)
    assert run.errors[0]["code"] == "policy_violation"
    assert violation(run)["tools"] == ["shell"]
    assert RunEvent.objects.filter(run=run, type="result").exists()  # it did say it was done


# --- the real runtimes ----------------------------------------------------------------------


def shell_script(tool: str) -> dict:
    """The model asks ``tool`` twice for the same append to log.txt, then answers."""
    call = {"tool_calls": [{"name": tool, "arguments": {"command": "echo x >> log.txt"}}]}
    return {
        "api_key": SCRIPTED_API_KEY,
        "untooled": TITLE,
        "responses": [call, call, "Appended twice."],
    }


def test_each_gated_call_of_a_real_runtime_needs_its_own_approval(worker, runtime, scripted_model):
    """paw-agent asks before each of its two ``shell`` calls, naming the call, and runs
    each once approved; python-agent-harness asks for nothing, so its first ``Bash`` call
    stops the run (it may already have acted: it announces a call as it starts it)."""
    tool = "shell" if runtime == PAW_AGENT else "Bash"
    scripted_model.load(shell_script(tool))
    conversation = ConversationFactory()
    log = workspace_ensure(conversation.id) / "log.txt"
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="Append x twice."
    )
    if runtime == HARNESS:
        run = wait_for(lambda: finished(run.id), what="the run to be stopped")
        lines = RunEvent.objects.filter(run=run).order_by("cursor").values_list("type", "kind")
        # However late the stop reaches the harness (here it finishes the run before it
        # does), the run ends with the violation, not done.
        assert run.status == Run.Status.ERROR, list(lines)
        assert run.errors[0]["code"] == "policy_violation"
        assert violation(run)["tools"] == ["Bash"]
        assert not Approval.objects.filter(run=run).exists()
        return
    seen: set = set()
    for _ in range(2):
        approval = pending(conversation, after=seen)
        seen.add(approval.id)
        assert approval.call == {
            "name": "shell",
            "args": {"command": "'echo x >> log.txt'"},
            "input": {"command": "echo x >> log.txt"},
        }
        approval_decide(approval_id=approval.id, user=conversation.user, approved=True)
    run = wait_for(lambda: finished(run.id), what="the run to end")
    assert run.status == Run.Status.DONE, run.errors
    assert log.read_text() == "x\nx\n"
    assert not RunEvent.objects.filter(run=run, type="policy_violation").exists()
    used = Approval.objects.filter(run=run, used_at__isnull=False)
    assert used.count() == 2
