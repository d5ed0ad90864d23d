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


def test_each_listed_conversation_has_its_own_run_and_approvals_on_every_page(
    api, user, other_user
):
    """The list reads a conversation's active run and pending approvals in its page query;
    each page and each search result carries the same as the conversation's own endpoint
    (which reads them with queries of their own)."""
    now = timezone.now()
    later = now + timedelta(seconds=90)
    running = conversation_of(user, title="budget running", last_activity_at=now)
    turn(running, "earlier")
    active = Run.objects.create(
        conversation=running, user=user, prompt="go", status=Run.Status.RUNNING
    )
    second = Approval.objects.create(
        conversation=running, run=active, kind="ask", expires_at=later, created_at=now
    )
    first = Approval.objects.create(
        conversation=running, run=active, kind="confirm", expires_at=later,
        created_at=now - timedelta(seconds=5),
    )  # fmt: skip
    idle = conversation_of(user, title="budget idle", last_activity_at=now - timedelta(minutes=1))
    turn(idle, "done long ago")
    starting = conversation_of(
        user, title="budget starting", last_activity_at=now - timedelta(minutes=2)
    )
    queued = Run.objects.create(
        conversation=starting, user=user, prompt="next", status=Run.Status.STARTING
    )
    own = Approval.objects.create(
        conversation=starting, run=queued, kind="confirm", expires_at=later
    )
    theirs = conversation_of(other_user, title="budget theirs")
    their_run = Run.objects.create(
        conversation=theirs, user=other_user, prompt="x", status=Run.Status.QUEUED
    )
    Approval.objects.create(conversation=theirs, run=their_run, kind="ask", expires_at=later)

    expected = {
        str(running.id): (str(active.id), [str(first.id), str(second.id)]),
        str(idle.id): (None, []),
        str(starting.id): (str(queued.id), [str(own.id)]),
    }
    for params in ({"page_size": 1}, {"page_size": 1, "search": "budget"}):
        seen = []
        body = api.get("/api/conversations", params).json()
        while True:
            seen += body["results"]
            if not body["next"]:
                break
            body = api.get(body["next"]).json()
        assert [c["id"] for c in seen] == [str(running.id), str(idle.id), str(starting.id)]
        for listed in seen:
            run_id, approval_ids = expected[listed["id"]]
            assert listed["active_run_id"] == run_id
            assert [a["id"] for a in listed["pending_approvals"]] == approval_ids
            detail = api.get(f"/api/conversations/{listed['id']}").json()
            assert listed["active_run_id"] == detail["active_run_id"]
            assert listed["pending_approvals"] == detail["pending_approvals"]
