"""An edited prompt or a regenerated answer (``run_replace``) through a real worker and
runtime against the scripted model: the replaced turn never reaches the model on the new
run, with paw-agent (its live sandbox is re-seeded with the ``history`` op, the same
process goes on) and with python-agent-harness (no ``history``: the sandbox restarts)."""

from __future__ import annotations

import json

import pytest

from conversations.models import Run, RunEvent
from conversations.services.runs import run_replace, run_start
from sandboxes.models import Sandbox
from tests.conftest import PAW_AGENT, SCRIPTED_API_KEY
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.observe import finished, sandbox_pids

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def script(answer: str) -> dict:
    return {"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": answer}


def model_messages(scripted_model, prompt: str) -> list[str]:
    """The messages of every request of the run asked ``prompt`` (the requests offering
    tools that carry it: other tests' sandboxes may still talk to the shared model
    server), as JSON text."""
    sent = [json.dumps(entry["body"].get("messages", [])) for entry in scripted_model.log]
    ours = [
        said
        for entry, said in zip(scripted_model.log, sent, strict=True)
        if entry["body"].get("tools") and prompt in said
    ]
    assert ours, "the model got no request of the run"
    return ours


def test_the_replaced_turn_is_not_in_the_new_runs_model_messages(worker, runtime, scripted_model):
    conversation = ConversationFactory()
    user = conversation.user

    def done(run: Run) -> Run:
        run = wait_for(lambda: finished(run.id), what="the run to end")
        assert run.status == Run.Status.DONE, run.errors
        return run

    scripted_model.load(script("Noted."))
    done(run_start(user=user, conversation_id=conversation.id, prompt="Remember 42."))
    scripted_model.load(script("Pelican noted."))
    replaced = done(
        run_start(user=user, conversation_id=conversation.id, prompt="My word is pelican.")
    )
    pids = sandbox_pids(conversation)

    # Edit the last prompt.
    scripted_model.load(script("The number is 42."))
    scripted_model.clear_log()
    edited = done(
        run_replace(
            user=user,
            conversation_id=conversation.id,
            run_id=replaced.id,
            prompt="What was the number?",
        )
    )
    assert edited.replaces_id == replaced.id
    for said in model_messages(scripted_model, "What was the number?"):
        assert "pelican" not in said.lower()  # neither the replaced prompt nor its answer
        if runtime == PAW_AGENT:
            assert "Remember 42." in said and "Noted." in said  # the turn before stays
    if runtime == PAW_AGENT:  # re-seeded in place: the same process (its kernel) goes on
        assert sandbox_pids(conversation) == pids
    else:  # python-agent-harness cannot be re-seeded: a new process, and the person is told
        assert len(sandbox_pids(conversation)) == 2
        assert RunEvent.objects.filter(
            conversation=conversation, run=edited, type="notice", kind="memory_lost"
        ).exists()

    # Regenerate that answer: the same prompt again, without the answer it replaces.
    scripted_model.load(script("It was 42, once more."))
    scripted_model.clear_log()
    regenerated = done(run_replace(user=user, conversation_id=conversation.id, run_id=edited.id))
    assert regenerated.prompt == "What was the number?"
    assert regenerated.answer == "It was 42, once more."
    for said in model_messages(scripted_model, "What was the number?"):
        assert said.count("What was the number?") == 1
        assert "The number is 42." not in said and "pelican" not in said.lower()
        if runtime == PAW_AGENT:
            assert "Remember 42." in said

    # A later prompt carries the newest version only.
    scripted_model.load(script("Fine."))
    scripted_model.clear_log()
    done(run_start(user=user, conversation_id=conversation.id, prompt="Thanks."))
    for said in model_messages(scripted_model, "Thanks."):
        assert "The number is 42." not in said and "pelican" not in said.lower()
        if runtime == PAW_AGENT:
            assert "It was 42, once more." in said and "Remember 42." in said
    # Nothing was lost: every version is stored with its events.
    for run in (replaced, edited):
        assert RunEvent.objects.filter(run=run, type="result").exists()
    assert Sandbox.objects.filter(conversation=conversation).exists()


def test_a_respawned_sandbox_is_seeded_without_the_replaced_turn(celery_worker, scripted_model):
    """The seed of a new process (here after a model change) leaves the replaced versions
    out."""
    from secrets_vault.providers import models_cache_forget

    conversation = ConversationFactory()
    user = conversation.user
    models = ["scripted-model", "scripted-model-2"]
    models_cache_forget(base_url=scripted_model.base_url, api_key=SCRIPTED_API_KEY)
    for prompt, answer in (("Remember 42.", "Noted."), ("My word is pelican.", "Pelican.")):
        scripted_model.load({**script(answer), "models": models})
        run = run_start(user=user, conversation_id=conversation.id, prompt=prompt)
        assert wait_for(lambda run=run: finished(run.id)).status == Run.Status.DONE
    scripted_model.load({**script("The number is 42."), "models": models})
    edited = run_replace(
        user=user, conversation_id=conversation.id, run_id=run.id, prompt="The number?"
    )
    assert wait_for(lambda: finished(edited.id)).status == Run.Status.DONE
    scripted_model.load({**script("Fine."), "models": models})
    scripted_model.clear_log()
    after = run_start(
        user=user, conversation_id=conversation.id, prompt="Thanks.", llm_model="scripted-model-2"
    )
    after = wait_for(lambda: finished(after.id))
    assert after.status == Run.Status.DONE, after.errors
    assert len(sandbox_pids(conversation)) == 2  # a new process for the new model
    for said in model_messages(scripted_model, "Thanks."):
        assert "Remember 42." in said and "The number is 42." in said
        assert "pelican" not in said.lower()
