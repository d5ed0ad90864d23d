"""The conversation list's search (``GET /api/conversations?search=``, PostgreSQL
full-text) and its live fields (``pending_approvals``, ``match``)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from conversations.models import Approval, Run
from conversations.selectors.sidebar import MAX_SEARCH_CHARS
from tests.factories import conversation_of

pytestmark = pytest.mark.django_db


def turn(conversation, prompt: str, answer: str = "") -> Run:
    return Run.objects.create(
        conversation=conversation,
        user=conversation.user,
        prompt=prompt,
        answer=answer,
        status=Run.Status.DONE,
    )


def found(api, search: str) -> list[dict]:
    response = api.get("/api/conversations", {"search": search})
    assert response.status_code == 200, response.content
    return response.json()["results"]


@pytest.fixture
def library(user, other_user):
    """Three conversations of the user's and one of another user's."""
    titled = conversation_of(user, title="Quarterly revenue review")
    prompted = conversation_of(user, title="Untitled analysis")
    turn(prompted, "Plot the tips by weekday from tips.csv", "Here is the chart.")
    answered = conversation_of(user, title="Untitled analysis")
    turn(answered, "What was the best day?", "Saturday had the highest total of bills.")
    theirs = conversation_of(other_user, title="Quarterly revenue of mallory")
    turn(theirs, "Plot the tips by weekday", "Saturday had the highest total of bills.")
    return titled, prompted, answered, theirs


def test_search_finds_by_title_prompt_and_answer_and_says_where(api, library):
    titled, prompted, answered, _ = library
    [hit] = found(api, "revenue")
    assert hit["id"] == str(titled.id)
    assert hit["match"] == {"field": "title", "text": "Quarterly revenue review"}
    [hit] = found(api, "weekday")
    assert hit["id"] == str(prompted.id)
    assert hit["match"]["field"] == "prompt" and "weekday" in hit["match"]["text"]
    [hit] = found(api, "saturday bills")
    assert hit["id"] == str(answered.id)
    assert hit["match"]["field"] == "answer"
    assert hit["match"]["text"].startswith("Saturday had the highest")


def test_search_is_full_text_stemmed_and_takes_web_syntax(api, library):
    titled, prompted, answered, _ = library
    assert [c["id"] for c in found(api, "reviews")] == [str(titled.id)]  # stemmed
    assert {c["id"] for c in found(api, "plot or saturday")} == {
        str(prompted.id),
        str(answered.id),
    }
    assert found(api, "saturday -bills") == []
    assert [c["id"] for c in found(api, '"highest total"')] == [str(answered.id)]
    assert found(api, "nothing-like-this-anywhere") == []


def test_search_never_returns_another_users_conversations(api, other_api, library):
    theirs = library[-1]
    assert str(theirs.id) not in {c["id"] for c in found(api, "mallory")}
    assert found(api, "mallory") == []
    assert [c["id"] for c in found(other_api, "saturday")] == [str(theirs.id)]


def test_no_search_lists_everything_with_a_null_match(api, library):
    results = found(api, "   ")
    assert len(results) == 3 and all(c["match"] is None for c in results)


def test_bad_search_input_is_a_clear_400(api, library):
    response = api.get("/api/conversations", {"search": "x" * (MAX_SEARCH_CHARS + 1)})
    assert response.status_code == 400
    assert response.json()["code"] == "search_too_long" and response.json()["detail"]
    response = api.get("/api/conversations", {"search": "tip\x00s"})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_search"
    assert len(found(api, "x" * MAX_SEARCH_CHARS)) == 0  # the longest allowed is fine


def test_search_results_page_with_the_search_kept(api, user):
    for n in range(5):
        conversation_of(user, title=f"budget {n}")
    conversation_of(user, title="other")
    response = api.get("/api/conversations", {"search": "budget", "page_size": 2})
    body = response.json()
    assert len(body["results"]) == 2 and "search=budget" in body["next"]
    seen = [c["title"] for c in body["results"]]
    while body["next"]:
        body = api.get(body["next"]).json()
        seen += [c["title"] for c in body["results"]]
    assert sorted(seen) == [f"budget {n}" for n in range(5)]


def test_pending_approvals_are_listed_with_their_deadline(api, user):
    conversation = conversation_of(user, title="waiting")
    run = Run.objects.create(
        conversation=conversation, user=user, prompt="go", status=Run.Status.RUNNING
    )
    deadline = timezone.now() + timedelta(seconds=90)
    pending = Approval.objects.create(
        conversation=conversation, run=run, kind="confirm", expires_at=deadline
    )
    Approval.objects.create(  # past its deadline: not waiting any more
        conversation=conversation,
        run=run,
        kind="confirm",
        expires_at=timezone.now() - timedelta(seconds=1),
    )
    Approval.objects.create(
        conversation=conversation,
        run=run,
        kind="ask",
        status=Approval.Status.ANSWERED,
        expires_at=deadline,
    )
    [listed] = api.get("/api/conversations").json()["results"]
    assert listed["active_run_id"] == str(run.id)
    assert [(a["id"], a["kind"]) for a in listed["pending_approvals"]] == [
        (str(pending.id), "confirm")
    ]
    assert listed["pending_approvals"][0]["expires_at"].endswith("Z")
    detail = api.get(f"/api/conversations/{conversation.id}").json()
    assert detail["pending_approvals"] == listed["pending_approvals"]
