"""Deleting a conversation, or forgetting its session, through the API stops its live
sandbox on the worker (no process left); deleting also removes the workspace, forgetting
keeps the transcript and makes the next sandbox start without the earlier turns."""

from __future__ import annotations

import pytest

from conversations.models import Conversation, Run
from conversations.workspaces import workspace_path
from sandboxes.models import Sandbox
from tests.conftest import SCRIPTED_API_KEY, api_client_for
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.observe import finished, marked_processes, process_alive

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

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
    assert Sandbox.objects.get(id=sandbox.id).state == Sandbox.State.STOPPED
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
