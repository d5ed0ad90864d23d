"""Runs and approvals over the REST API: start, read, cancel, decide; bad input, other
users' objects and the run throttle."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from conversations.models import Approval, Run
from paw_project.throttles import rate_reset
from tests.conftest import SCRIPTED_API_KEY, api_client_for
from tests.factories import conversation_of, missing_id
from tests.live import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def conversation(user):
    return conversation_of(user, title="Tips")


@pytest.fixture
def configured(settings, scripted_model):
    """A default provider, as the worker tests have, for tests that need no worker."""
    settings.PAW_LLM_BASE_URL = scripted_model.base_url
    settings.PAW_LLM_API_KEY = SCRIPTED_API_KEY
    settings.PAW_LLM_MODEL = "scripted-model"


@pytest.mark.slow
def test_a_run_starts_with_202_finishes_and_its_events_can_be_polled(
    api, conversation, celery_worker, scripted_model
):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "fallback": "The average tip is 3.00."})
    response = api.post(
        f"/api/conversations/{conversation.id}/runs", {"prompt": "Average tip?"}, format="json"
    )
    assert response.status_code == 202, response.json()
    body = response.json()
    assert body["status"] == "queued" and body["prompt"] == "Average tip?"
    assert body["provider"] == "default" and body["model"] == "scripted-model"
    run_url = f"/api/conversations/{conversation.id}/runs/{body['id']}"
    done = wait_for(
        lambda: (r := api.get(run_url).json())["status"] in ("done", "error") and r, what="run end"
    )
    assert done["status"] == "done", done
    assert done["answer"] == "The average tip is 3.00."
    assert done["usage"]["input"] > 0 and done["usage"]["rounds"] == 1
    events = api.get(f"/api/conversations/{conversation.id}/events?after=0").json()["events"]
    assert events[0]["event"]["type"] == "start" and events[-1]["event"]["type"] == "result"
    listing = api.get(f"/api/conversations/{conversation.id}/runs").json()
    assert [r["id"] for r in listing["results"]] == [body["id"]]


def test_a_second_run_while_one_is_active_gets_409(api, conversation, configured):
    Run.objects.create(conversation=conversation, user=conversation.user, prompt="busy")
    response = api.post(
        f"/api/conversations/{conversation.id}/runs", {"prompt": "me too"}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["code"] == "run_active"
    assert Run.objects.filter(conversation=conversation).count() == 1


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({}, "required"),
        ({"prompt": ""}, "blank"),
        ({"prompt": "   "}, "blank"),
        ({"prompt": ["a list"]}, "invalid"),
        ({"prompt": "x" * 100_001}, "max_length"),
        ({"prompt": "hi", "temperature": 2}, "unknown_field"),
        ({"prompt": "hi", "datasources": ["no-such-db"]}, "unknown_datasource"),
        ({"prompt": "hi", "datasources": "warehouse"}, "not_a_list"),
        ({"prompt": "hi", "llm_provider": "nonexistent"}, "unknown_provider"),
    ],
)
def test_bad_run_input_is_a_400_and_starts_nothing(api, conversation, configured, body, code):
    response = api.post(f"/api/conversations/{conversation.id}/runs", body, format="json")
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == code
    assert response.json()["detail"]
    assert not Run.objects.exists()


def test_without_any_provider_a_run_is_refused_with_how_to_add_a_key(api, conversation, settings):
    settings.PAW_LLM_BASE_URL = settings.PAW_LLM_API_KEY = settings.PAW_LLM_MODEL = ""
    response = api.post(
        f"/api/conversations/{conversation.id}/runs", {"prompt": "hi"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "no_provider"
    assert "/api/secrets/" in response.json()["detail"]


def test_another_users_conversation_and_runs_are_404(api, other_api, conversation, configured):
    run = Run.objects.create(conversation=conversation, user=conversation.user, prompt="mine")
    base = f"/api/conversations/{conversation.id}"
    assert other_api.post(f"{base}/runs", {"prompt": "hi"}, format="json").status_code == 404
    assert other_api.get(f"{base}/runs").status_code == 404
    assert other_api.get(f"{base}/runs/{run.id}").status_code == 404
    assert other_api.post(f"{base}/runs/{run.id}/cancel").status_code == 404
    assert api.get(f"{base}/runs/{missing_id()}").status_code == 404
    assert Run.objects.get(id=run.id).status == Run.Status.QUEUED


def test_cancel_is_202_then_409_once_finished(api, conversation):
    run = Run.objects.create(
        conversation=conversation, user=conversation.user, prompt="never started"
    )
    url = f"/api/conversations/{conversation.id}/runs/{run.id}/cancel"
    response = api.post(url)
    assert response.status_code == 202
    assert response.json()["status"] == "cancelled"
    again = api.post(url)
    assert again.status_code == 409
    assert again.json()["code"] == "run_finished"


def test_run_starts_are_throttled_per_user_with_retry_after(api, user, configured, settings):
    settings.PAW_THROTTLE_RUNS = "2/min"
    rate_reset("runs", f"user-{user.pk}")
    codes = []
    for n in range(3):
        conversation = conversation_of(user, title=f"c{n}")
        codes.append(
            api.post(f"/api/conversations/{conversation.id}/runs", {"prompt": "hi"}, format="json")
        )
    assert [r.status_code for r in codes] == [202, 202, 429]
    assert codes[2].json()["code"] == "throttled"
    assert int(codes[2]["Retry-After"]) > 0
    assert Run.objects.count() == 2
    # Reading runs is not throttled.
    assert api.get(f"/api/conversations/{conversation.id}/runs").status_code == 200


def make_approval(conversation, **fields) -> Approval:
    run = Run.objects.create(
        conversation=conversation, user=conversation.user, prompt="p", status="running"
    )
    defaults = {
        "kind": "confirm",
        "prompt": "Run shell: ls",
        "expires_at": timezone.now() + timedelta(minutes=2),
    }
    return Approval.objects.create(conversation=conversation, run=run, **{**defaults, **fields})


def test_pending_approvals_are_listed_and_decided_once(api, conversation):
    approval = make_approval(conversation)
    listing = api.get(f"/api/conversations/{conversation.id}/approvals?status=pending").json()
    assert [a["id"] for a in listing["results"]] == [str(approval.id)]
    assert listing["results"][0]["prompt"] == "Run shell: ls"
    decided = api.post(f"/api/approvals/{approval.id}/decision", {"approved": True}, format="json")
    assert decided.status_code == 200
    assert (decided.json()["status"], decided.json()["decided_by"], decided.json()["via"]) == (
        "approved",
        "user",
        "api",
    )
    again = api.post(f"/api/approvals/{approval.id}/decision", {"approved": False}, format="json")
    assert again.status_code == 409
    assert again.json()["code"] == "approval_closed"
    assert Approval.objects.get(id=approval.id).status == "approved"
    assert (
        api.get(f"/api/conversations/{conversation.id}/approvals?status=pending").json()["results"]
        == []
    )


def test_a_question_is_answered_with_answers(api, conversation):
    approval = make_approval(
        conversation, kind="ask", prompt="", questions=[{"question": "Which?", "options": []}]
    )
    response = api.post(
        f"/api/approvals/{approval.id}/decision", {"answers": ["tips.csv"]}, format="json"
    )
    assert response.status_code == 200
    assert response.json()["answers"] == ["tips.csv"] and response.json()["status"] == "answered"


def test_an_expired_approval_cannot_be_decided(api, conversation):
    approval = make_approval(conversation, expires_at=timezone.now() - timedelta(seconds=1))
    response = api.post(f"/api/approvals/{approval.id}/decision", {"approved": True}, format="json")
    assert response.status_code == 409
    assert Approval.objects.get(id=approval.id).status == "pending"


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"approved": "yes"},
        {"answers": []},
        {"answers": "x"},
        {"answers": [""]},
        {"approved": True, "x": 1},
        {"approved": True, "answers": ["tips.csv"]},
    ],
)
def test_a_malformed_decision_is_a_400_and_changes_nothing(api, conversation, body):
    approval = make_approval(
        conversation, kind="ask", prompt="", questions=[{"question": "Q?", "options": []}]
    )
    response = api.post(f"/api/approvals/{approval.id}/decision", body, format="json")
    assert response.status_code == 400, response.json()
    assert Approval.objects.get(id=approval.id).status == "pending"


@pytest.mark.parametrize("approved", ["yes", "true", 1, 0, "false"])
def test_a_confirm_is_decided_only_by_a_json_boolean(api, conversation, approved):
    approval = make_approval(conversation)
    response = api.post(
        f"/api/approvals/{approval.id}/decision", {"approved": approved}, format="json"
    )
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == "invalid"
    assert response.json()["fields"] == {"approved": ["Must be a JSON boolean (true or false)."]}
    assert Approval.objects.get(id=approval.id).status == "pending"


@pytest.mark.parametrize(
    "body",
    [{"auto_approve": "yes"}, {"approval_timeout_seconds": "60"}, {"title": 123}],
)
def test_conversation_fields_take_only_their_json_type(api, conversation, body):
    before = api.get(f"/api/conversations/{conversation.id}").json()
    response = api.patch(f"/api/conversations/{conversation.id}", body, format="json")
    assert response.status_code == 400, response.json()
    assert set(response.json()["fields"]) == set(body)
    assert api.get(f"/api/conversations/{conversation.id}").json() == before


def test_another_users_approval_is_404(other_api, conversation):
    approval = make_approval(conversation)
    assert (
        other_api.post(
            f"/api/approvals/{approval.id}/decision", {"approved": True}, format="json"
        ).status_code
        == 404
    )
    assert other_api.get(f"/api/conversations/{conversation.id}/approvals").status_code == 404
    assert (
        api_client_for(None)
        .post(f"/api/approvals/{approval.id}/decision", {"approved": True})
        .status_code
        == 401
    )
    assert Approval.objects.get(id=approval.id).status == "pending"
