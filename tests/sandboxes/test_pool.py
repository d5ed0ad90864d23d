"""The sandbox process (``sandboxes/pool.py``) survives whatever a runtime does at start and on
the way: a bad handshake, no ready, sudden death."""

from __future__ import annotations

import pytest

from conversations.models import Run
from sandboxes.models import Sandbox
from tests.live import GroupListener, wait_for
from tests.sandboxes.observe import finished
from tests.sandboxes.scenarios import start_with_mode

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


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
