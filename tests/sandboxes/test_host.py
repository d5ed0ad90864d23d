"""The host survives whatever a runtime writes: bad handshakes, garbage, sudden death."""

from __future__ import annotations

import pytest

from conversations.models import Run, RunEvent
from conversations.services.runs import run_start
from conversations.workspaces import workspace_ensure
from sandboxes.models import Sandbox
from tests.factories import ConversationFactory
from tests.live import GroupListener, wait_for
from tests.sandboxes.observe import finished
from tests.support import PYTHON, ROOT

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

FAKE = f"{PYTHON} {ROOT / 'tests' / 'runtimes' / 'fake_runtime.py'} serve"


@pytest.fixture
def fake_worker(worker_node):
    return worker_node.use(FAKE, PAW_SANDBOX_ISOLATION="none", PAW_SANDBOX_READY_TIMEOUT="3")


def start_with_mode(mode: str, prompt: str = "go"):
    conversation = ConversationFactory()
    (workspace_ensure(conversation.id) / "fake_mode").write_text(mode)
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt=prompt)
    return conversation, run


def test_an_unknown_protocol_version_fails_the_run_with_a_clear_error(fake_worker):
    conversation, run = start_with_mode("bad-version")
    run = wait_for(lambda: finished(run.id))
    assert run.status == Run.Status.ERROR
    assert run.errors[0]["code"] == "sandbox_start"
    assert "protocol version 99" in run.errors[0]["message"]
    assert not Sandbox.objects.filter(
        conversation=conversation, state__in=Sandbox.LIVE_STATES
    ).exists()


def test_a_runtime_that_never_gets_ready_fails_within_the_ready_timeout(fake_worker):
    conversation, run = start_with_mode("silent")
    run = wait_for(lambda: finished(run.id), timeout=15)
    assert run.status == Run.Status.ERROR
    assert run.errors[0]["code"] == "sandbox_start"
    assert "did not start within 3 s" in run.errors[0]["message"]
    assert Sandbox.objects.get(conversation=conversation).state == Sandbox.State.DEAD


def test_garbage_lines_are_kept_as_events_and_the_run_still_finishes(fake_worker):
    conversation, run = start_with_mode("garbage")
    run = wait_for(lambda: finished(run.id))
    assert run.status == Run.Status.DONE and run.answer == "survived"
    events = list(RunEvent.objects.filter(conversation=conversation).order_by("cursor"))
    types = [(e.type, e.kind) for e in events]
    assert types[0] == ("start", "")
    malformed = [e.payload for e in events if e.kind == "malformed"]
    assert [m["message"] for m in malformed[:3]] == [
        "this is not json",
        "[1, 2, 3]",
        '{"no_type": true}',
    ]
    assert malformed[3]["message"].endswith(" [cut]") and len(malformed[3]["message"]) < 5000
    assert ("mystery", "") in types  # unknown types are relayed, not dropped
    # A NUL character (which PostgreSQL cannot store) does not cost the line.
    assert "nul\ufffdhere" in [e.payload.get("text") for e in events]
    notices = [e.payload["message"] for e in events if e.type == "notice"]
    assert any("missing before seq 5" in n for n in notices)
    assert any("someone-else" in n for n in notices)
    assert [e for e in events if e.type != "notice"][-1].type == "result"
    assert all(e.run_id == run.id for e in events)


def test_a_runtime_dying_mid_run_ends_the_run_with_its_exit_code_and_stderr(fake_worker):
    conversation, run = start_with_mode("die")
    with GroupListener(conversation.id) as listener:
        run = wait_for(lambda: finished(run.id))
        listener.wait(
            lambda lis: any(m["status"] == "error" for m in lis.of_type("run.status")),
            what="error status",
        )
    assert run.status == Run.Status.ERROR
    assert run.errors[0]["code"] == "sandbox_exited"
    assert run.errors[0]["message"].startswith("sandbox exited (code 3)")
    assert "boom" in run.errors[0]["message"]
    sandbox = Sandbox.objects.get(conversation=conversation)
    assert (
        sandbox.state == Sandbox.State.DEAD
        and sandbox.exit_code == 3
        and "boom" in sandbox.stderr_tail
    )


def test_a_fast_flood_of_lines_is_stored_exactly_once_in_order(fake_worker):
    conversation, run = start_with_mode("flood 5000")
    with GroupListener(conversation.id) as listener:
        run = wait_for(lambda: finished(run.id), timeout=60)
        listener.wait(
            lambda lis: any(e["event"]["type"] == "result" for e in lis.events()), what="all events"
        )
    assert run.status == Run.Status.DONE
    deltas = list(
        RunEvent.objects.filter(conversation=conversation, type="delta")
        .order_by("cursor")
        .values_list("payload", flat=True)
    )
    assert [d["text"] for d in deltas] == [f"{n} " for n in range(1, 5001)]
    live = [e["event"]["text"] for e in listener.events() if e["event"]["type"] == "delta"]
    assert live == [f"{n} " for n in range(1, 5001)]
