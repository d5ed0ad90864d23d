"""Routing (``sandboxes/enqueue.py``) across two real worker nodes: runs and ops go to the node
that owns the conversation's sandbox, and through the shared queue once it is gone."""

from __future__ import annotations

import json
import os
import signal

import pytest

from conversations.models import Approval, Run, RunEvent
from conversations.services.approvals import approval_decide
from conversations.services.runs import run_cancel, run_start
from conversations.services.workspaces import workspace_ensure
from sandboxes.models import Sandbox
from sandboxes.selectors import node_is_alive
from tests.conftest import PAW_AGENT, SCRIPTED_API_KEY
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.conftest import consume_runs, stop_consuming_runs
from tests.sandboxes.observe import finished, process_alive, process_start_time
from tests.sandboxes.scenarios import STORY

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


SCRIPT = {
    "api_key": SCRIPTED_API_KEY,
    "untooled": "Title",
    "rules": [
        {"match": "my name is ada", "responses": ["Noted, Ada."]},
        {"match": "still there", "responses": ["Yes."]},
        {
            "match": "delete old.txt",
            "responses": [
                {"tool_calls": [{"name": "delete_file", "arguments": {"path": "old.txt"}}]},
                "Deleted.",
            ],
        },
        {"match": "long story", "responses": [STORY]},
        {"match": "what is my name", "responses": ["You are Ada."]},
    ],
}


def live_sandbox(conversation) -> Sandbox:
    """The conversation's live sandbox row."""
    return Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)


def run_to_end(conversation, prompt: str) -> Run:
    """Start a run of ``prompt`` and wait for its end."""
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt=prompt)
    return wait_for(lambda: finished(run.id), timeout=30, what=f"the run {prompt!r} to end")


def requests_for(scripted_model, prompt: str) -> list[str]:
    """The message lists (as JSON) of the model requests whose last message is ``prompt``."""
    return [
        json.dumps(messages)
        for entry in scripted_model.log
        if (messages := entry["body"].get("messages")) and messages[-1].get("content") == prompt
    ]


def test_runs_and_ops_go_to_the_sandboxs_node_and_through_the_shared_queue_once_it_is_gone(
    worker_node, second_node, scripted_model, settings
):
    main, other = worker_node.use(PAW_AGENT), second_node
    scripted_model.load(SCRIPT)
    scripted_model.clear_log()
    conversation = ConversationFactory()
    try:
        stop_consuming_runs(main)  # a new conversation can only land on the other node
        first = run_to_end(conversation, "My name is Ada.")
        assert (first.status, first.node) == (Run.Status.DONE, other.name), first.errors
        owned = live_sandbox(conversation)
        assert owned.node == other.name
        identity = (owned.pid, process_start_time(owned.pid))

        # From here on only the main node takes from the shared queue: what the other node
        # gets was routed to it.
        consume_runs(main)
        stop_consuming_runs(other)
        second = run_to_end(conversation, "Still there?")
        assert (second.status, second.node) == (Run.Status.DONE, other.name), second.errors
        assert live_sandbox(conversation).id == owned.id
        assert (owned.pid, process_start_time(owned.pid)) == identity  # the same process

        # An approval answer reaches the owner: its runtime deletes the file.
        target = workspace_ensure(conversation.id) / "old.txt"
        target.write_text("old")
        third = run_start(
            user=conversation.user, conversation_id=conversation.id, prompt="Please delete old.txt"
        )
        approval = wait_for(
            lambda: Approval.objects.filter(run=third, status=Approval.Status.PENDING).first(),
            what="the confirm",
        )
        approval_decide(approval_id=approval.id, user=conversation.user, approved=True)
        third = wait_for(lambda: finished(third.id), what="the approved run to end")
        assert (third.status, third.node) == (Run.Status.DONE, other.name), third.errors
        assert not target.exists()

        # A cancel reaches the owner: its runtime ends the run with its own cancelled result.
        fourth = run_start(
            user=conversation.user, conversation_id=conversation.id, prompt="A long story, please."
        )
        wait_for(
            lambda: RunEvent.objects.filter(run=fourth, type="delta").count() >= 3,
            what="the story to stream",
        )
        run_cancel(user=conversation.user, conversation_id=conversation.id, run_id=fourth.id)
        fourth = wait_for(lambda: finished(fourth.id), what="the cancelled run to end")
        assert (fourth.status, fourth.node) == (Run.Status.CANCELLED, other.name)
        assert RunEvent.objects.filter(run=fourth, type="result", payload__cancelled=True).exists()
        assert (owned.pid, process_start_time(owned.pid)) == identity

        # The owner node dies. Once it counts as lost, the next run goes through the shared
        # queue to the main node, which starts a new sandbox seeded with the history.
        os.kill(other.process.pid, signal.SIGKILL)
        other.process.wait(timeout=10)
        settings.PAW_NODE_DEAD_SECONDS = 1
        wait_for(lambda: not node_is_alive(other.name), what="the other node to count as lost")
        scripted_model.clear_log()
        fifth = run_to_end(conversation, "What is my name?")
        assert (fifth.status, fifth.node) == (Run.Status.DONE, main.name), fifth.errors
        respawned = live_sandbox(conversation)
        assert respawned.node == main.name and respawned.id != owned.id
        assert process_alive(respawned.pid)
        assert Sandbox.objects.get(id=owned.id).state == Sandbox.State.DEAD
        seen = requests_for(scripted_model, "What is my name?")
        assert seen and all("My name is Ada." in messages for messages in seen)
    finally:
        consume_runs(main)
