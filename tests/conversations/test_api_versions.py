"""Editing the last prompt and regenerating the last answer over the REST API
(``POST .../runs`` with ``replaces``): a new run that is the turn's next version, the
earlier versions kept and shown, only the last turn, never during an active run, other
people's runs 404, and the replaced runs left out of what a new sandbox is seeded with."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from conversations.models import Run
from conversations.selectors.runs import conversation_turns
from tests.conftest import SCRIPTED_API_KEY
from tests.factories import conversation_of, missing_id

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def configured(settings, scripted_model):
    """A default provider, so runs can be created (no worker needed: they stay queued)."""
    settings.PAW_LLM_BASE_URL = scripted_model.base_url
    settings.PAW_LLM_API_KEY = SCRIPTED_API_KEY
    settings.PAW_LLM_MODEL = "scripted-model"


@pytest.fixture
def conversation(user):
    return conversation_of(user, title="Tips")


def done_run(conversation, prompt: str, answer: str, *, minutes_ago: int = 0, **fields) -> Run:
    """A finished run, created ``minutes_ago`` minutes ago (the turns' order)."""
    return Run.objects.create(
        conversation=conversation,
        user=conversation.user,
        prompt=prompt,
        answer=answer,
        status=Run.Status.DONE,
        created_at=timezone.now() - timedelta(minutes=minutes_ago),
        **fields,
    )


def finish(run_id: str, answer: str) -> None:
    Run.objects.filter(id=run_id).update(status=Run.Status.DONE, answer=answer)


def test_regenerating_the_last_answer_starts_its_next_version(api, conversation, configured):
    first = done_run(conversation, "Load tips.csv", "Loaded.", minutes_ago=2)
    last = done_run(conversation, "Average tip?", "It is 3.", minutes_ago=1)
    base = f"/api/conversations/{conversation.id}"

    response = api.post(f"{base}/runs", {"replaces": str(last.id)}, format="json")

    assert response.status_code == 202, response.json()
    new = response.json()
    assert new["status"] == "queued" and new["prompt"] == "Average tip?"
    assert new["replaces"] == str(last.id) and new["replaced_by"] is None
    assert new["version"] == 2 and new["versions"] == [str(last.id), new["id"]]
    listed = {r["id"]: r for r in api.get(f"{base}/runs").json()["results"]}
    assert len(listed) == 3
    assert listed[str(last.id)]["replaced_by"] == new["id"]
    assert listed[str(last.id)]["version"] == 1
    assert listed[str(last.id)]["versions"] == [str(last.id), new["id"]]
    assert listed[str(first.id)]["versions"] == [str(first.id)]
    assert listed[str(first.id)]["version"] == 1 and listed[str(first.id)]["replaces"] is None
    # The earlier version is kept as it was.
    assert api.get(f"{base}/runs/{last.id}").json()["answer"] == "It is 3."


def test_editing_the_last_prompt_and_the_history_shows_the_versions(api, conversation, configured):
    done_run(conversation, "Load tips.csv", "Loaded.", minutes_ago=2)
    last = done_run(conversation, "Average tip?", "It is 3.", minutes_ago=1)
    base = f"/api/conversations/{conversation.id}"

    edited = api.post(
        f"{base}/runs", {"replaces": str(last.id), "prompt": "Median tip?"}, format="json"
    )
    assert edited.status_code == 202, edited.json()
    edited = edited.json()
    assert edited["prompt"] == "Median tip?" and edited["replaces"] == str(last.id)
    finish(edited["id"], "It is 2.9.")

    # From the first version (the one the person looks at) again: the new run still
    # replaces the newest version, and regenerates the prompt of the one named.
    third = api.post(f"{base}/runs", {"replaces": str(last.id)}, format="json")
    assert third.status_code == 202, third.json()
    third = third.json()
    assert third["prompt"] == "Average tip?" and third["replaces"] == edited["id"]
    assert third["version"] == 3
    assert third["versions"] == [str(last.id), edited["id"], third["id"]]
    finish(third["id"], "It is 3.1.")

    history = api.get(f"{base}/history").json()["results"]
    assert [t["prompt"] for t in history] == [
        "Load tips.csv", "Average tip?", "Median tip?", "Average tip?",
    ]  # fmt: skip
    assert [t["version"] for t in history] == [1, 1, 2, 3]
    assert [t["in_memory"] for t in history] == [True, False, False, True]
    assert history[1]["versions"] == history[3]["versions"] == third["versions"]
    # What a new sandbox is seeded with: the first turn and the newest version only.
    assert conversation_turns(conversation_id=conversation.id, limit=10) == [
        {"prompt": "Load tips.csv", "answer": "Loaded."},
        {"prompt": "Average tip?", "answer": "It is 3.1."},
    ]


def test_only_the_last_turn_can_be_edited_or_regenerated(api, conversation, configured):
    first = done_run(conversation, "Load tips.csv", "Loaded.", minutes_ago=2)
    last = done_run(conversation, "Average tip?", "It is 3.", minutes_ago=1)
    base = f"/api/conversations/{conversation.id}"
    for body in ({"replaces": str(first.id)}, {"replaces": str(first.id), "prompt": "Edit"}):
        response = api.post(f"{base}/runs", body, format="json")
        assert response.status_code == 409, response.json()
        assert response.json()["code"] == "not_last_turn"
        assert response.json()["detail"]
    # An earlier version of an older turn neither (the turn after it is the last).
    regenerated = api.post(f"{base}/runs", {"replaces": str(last.id)}, format="json").json()
    finish(regenerated["id"], "It is 3.0.")
    newer = api.post(f"{base}/runs", {"prompt": "And by day?"}, format="json").json()
    finish(newer["id"], "Friday.")
    for old in (last.id, regenerated["id"]):
        response = api.post(f"{base}/runs", {"replaces": str(old)}, format="json")
        assert response.status_code == 409 and response.json()["code"] == "not_last_turn"
    assert Run.objects.filter(conversation=conversation).count() == 4


def test_not_while_a_run_is_active(api, conversation, configured):
    done_run(conversation, "Load tips.csv", "Loaded.", minutes_ago=2)
    last = done_run(conversation, "Average tip?", "It is 3.", minutes_ago=1)
    base = f"/api/conversations/{conversation.id}"
    for status in Run.ACTIVE_STATUSES:
        Run.objects.filter(id=last.id).update(status=status)
        for body in ({"replaces": str(last.id)}, {"replaces": str(last.id), "prompt": "x"}):
            response = api.post(f"{base}/runs", body, format="json")
            assert response.status_code == 409, response.json()
            assert response.json()["code"] == "run_active"
    assert Run.objects.filter(conversation=conversation).count() == 2


def test_a_failed_or_cancelled_last_run_can_be_regenerated(api, conversation, configured):
    last = done_run(conversation, "Average tip?", "")
    base = f"/api/conversations/{conversation.id}"
    for status in (Run.Status.ERROR, Run.Status.CANCELLED):
        Run.objects.filter(id=last.id).update(status=status)
        response = api.post(f"{base}/runs", {"replaces": str(last.id)}, format="json")
        assert response.status_code == 202, response.json()
        Run.objects.filter(id=response.json()["id"]).update(status=Run.Status.ERROR)
        last = Run.objects.get(id=response.json()["id"])
    assert len(api.get(f"{base}/runs/{last.id}").json()["versions"]) == 3


def test_other_peoples_runs_and_runs_of_other_conversations_are_404(
    api, other_api, conversation, configured
):
    last = done_run(conversation, "Average tip?", "It is 3.")
    elsewhere = done_run(conversation_of(conversation.user), "Other", "Yes.")
    base = f"/api/conversations/{conversation.id}"
    response = other_api.post(f"{base}/runs", {"replaces": str(last.id)}, format="json")
    assert response.status_code == 404
    for missing in (str(elsewhere.id), missing_id()):
        response = api.post(f"{base}/runs", {"replaces": missing}, format="json")
        assert response.status_code == 404, response.json()
        assert response.json()["code"] == "not_found"
    assert Run.objects.count() == 2


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"replaces": "not-a-uuid"}, "invalid"),
        ({"replaces": None}, "null"),
        ({"replaces": "LAST", "prompt": ""}, "blank"),
        ({"replaces": "LAST", "prompt": "x" * 100_001}, "max_length"),
        ({"replaces": "LAST", "temperature": 1}, "unknown_field"),
    ],
)
def test_bad_replace_input_is_a_400_and_starts_nothing(api, conversation, configured, body, code):
    last = done_run(conversation, "Average tip?", "It is 3.")
    body = {k: (str(last.id) if v == "LAST" else v) for k, v in body.items()}
    response = api.post(f"/api/conversations/{conversation.id}/runs", body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == code
    assert Run.objects.count() == 1
