"""Events API: stored events in cursor order with a cursor to poll from."""

from __future__ import annotations

import pytest

from conversations.models import Run, RunEvent
from tests.factories import conversation_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(user):
    conversation = conversation_of(user)
    run = Run.objects.create(conversation=conversation, user=user, prompt="p", status="done")
    # Inserted out of order: the API must answer in cursor order.
    for cursor in (3, 1, 2, 5, 4):
        RunEvent.objects.create(
            conversation=conversation,
            run=run,
            cursor=cursor,
            type="notify",
            kind="text",
            payload={"type": "notify", "n": cursor},
        )
    return conversation


def events_url(conversation) -> str:
    return f"/api/conversations/{conversation.id}/events"


def test_events_in_cursor_order_with_payload(api, conversation):
    body = api.get(events_url(conversation)).json()
    assert [e["cursor"] for e in body["events"]] == [1, 2, 3, 4, 5]
    first = body["events"][0]
    assert set(first) == {"cursor", "run_id", "type", "kind", "event", "created"}
    assert first["event"] == {"type": "notify", "n": 1} and first["kind"] == "text"
    assert body["next_after"] == 5 and body["has_more"] is False


def test_polling_with_next_after_misses_nothing(api, user, conversation):
    seen, after = [], 0
    for _ in range(10):
        body = api.get(events_url(conversation), {"after": after, "limit": 2}).json()
        seen += [e["cursor"] for e in body["events"]]
        after = body["next_after"]
        if not body["has_more"]:
            break
    assert seen == [1, 2, 3, 4, 5]
    RunEvent.objects.create(conversation=conversation, cursor=6, type="notice")
    body = api.get(events_url(conversation), {"after": after}).json()
    assert [e["cursor"] for e in body["events"]] == [6]
    assert body["events"][0]["run_id"] is None
    empty = api.get(events_url(conversation), {"after": 6}).json()
    assert empty == {"events": [], "next_after": 6, "has_more": False}


@pytest.mark.parametrize(
    "params",
    [
        {"after": "x"},
        {"after": -1},
        {"limit": 0},
        {"limit": 1001},
        {"limit": "ten"},
        {"after": "1e3"},
        {"after": 2**64},
    ],
)
def test_bad_parameters_are_400(api, conversation, params):
    response = api.get(events_url(conversation), params)
    assert response.status_code == 400
    assert response.json()["detail"]


def test_events_of_another_users_conversation_are_404(other_api, conversation):
    assert other_api.get(events_url(conversation)).status_code == 404
