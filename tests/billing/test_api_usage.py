"""``GET /api/usage``: sums, the daily series, breakdowns, date boundaries (UTC days,
both ends included), the budget block, and who may see whose usage."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import Budget
from billing.selectors import MAX_RANGE_DAYS, month_start, next_month_start
from tests.billing.ledger import at, ledger_event
from tests.conftest import api_client_for
from tests.factories import conversation_of

pytestmark = pytest.mark.django_db

JUNE = "/api/usage?from=2026-06-01&to=2026-06-30"


@pytest.fixture
def june(user, other_user):
    """A month of ledger rows for ``user`` around June 2026, plus someone else's."""
    tips = conversation_of(user, title="Tips")
    sales = conversation_of(user, title="Sales")
    rows = [
        ("2026-05-31T23:59:59.999999", 1, 0, tips, "model-a"),  # May: outside
        ("2026-06-01T00:00:00", 100, 10, tips, "model-a"),  # first instant: inside
        ("2026-06-01T23:30:00", 200, 20, sales, "model-b"),
        ("2026-06-15T12:00:00", 300, 30, tips, "model-b"),
        ("2026-06-30T23:59:59.999999", 400, 40, None, "model-a"),  # deleted conversation
        ("2026-07-01T00:00:00", 5000, 500, tips, "model-a"),  # July: outside
    ]
    for created, input_tokens, output_tokens, conversation, model in rows:
        ledger_event(
            user=user,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            created=at(created),
            conversation=conversation,
            model=model,
        )
    ledger_event(user=other_user, input_tokens=7777, created=at("2026-06-10T10:00:00"))
    return {"tips": tips, "sales": sales}


def test_usage_sums_days_conversations_and_models_within_inclusive_utc_bounds(api, june, settings):
    settings.TIME_ZONE = "Pacific/Auckland"  # days are UTC days whatever the server's zone
    response = api.get(JUNE)
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["from"], body["to"]) == ("2026-06-01", "2026-06-30")
    assert body["user"]["username"] == "alice"
    assert body["totals"] == {
        "input_tokens": 1000,
        "output_tokens": 100,
        "tokens": 1100,
        "rounds": 4,
        "runs": 4,
    }
    daily = body["daily"]
    assert [d["date"] for d in daily][:2] == ["2026-06-01", "2026-06-02"]
    assert len(daily) == 30 and daily[-1]["date"] == "2026-06-30"
    by_day = {d["date"]: d["tokens"] for d in daily}
    assert by_day["2026-06-01"] == 110 + 220  # 23:30 UTC is still 1 June
    assert by_day["2026-06-15"] == 330 and by_day["2026-06-30"] == 440
    assert by_day["2026-06-02"] == 0
    assert sum(by_day.values()) == 1100
    assert daily[1] == {
        "date": "2026-06-02",
        "input_tokens": 0,
        "output_tokens": 0,
        "tokens": 0,
        "rounds": 0,
        "runs": 0,
    }
    conversations = [(c["title"], c["tokens"], c["runs"]) for c in body["by_conversation"]]
    assert conversations == [("", 440, 1), ("Tips", 440, 2), ("Sales", 220, 1)]
    assert body["by_conversation"][0]["conversation_id"] is None
    assert body["by_conversation"][1]["conversation_id"] == str(june["tips"].id)
    models = [(m["provider"], m["model"], m["tokens"]) for m in body["by_model"]]
    assert models == [("default", "model-a", 550), ("default", "model-b", 550)]  # a tie: by name


def test_one_day_ranges_include_the_whole_day(api, june):
    first = api.get("/api/usage?from=2026-06-01&to=2026-06-01").json()
    assert first["totals"]["tokens"] == 330 and len(first["daily"]) == 1
    last = api.get("/api/usage?from=2026-06-30&to=2026-06-30").json()
    assert last["totals"]["tokens"] == 440
    july = api.get("/api/usage?from=2026-07-01&to=2026-07-01").json()
    assert july["totals"]["tokens"] == 5500
    may = api.get("/api/usage?from=2026-05-31&to=2026-05-31").json()
    assert may["totals"]["tokens"] == 1


def test_the_default_range_is_this_month_and_the_budget_is_included(api, user, settings):
    settings.PAW_BUDGET_MONTHLY_TOKENS = 50_000
    settings.PAW_BUDGET_RUN_TOKENS = 4_000
    now = timezone.now()
    ledger_event(user=user, input_tokens=1200, output_tokens=34)
    ledger_event(user=user, input_tokens=999, created=month_start(now) - timedelta(seconds=1))
    body = api.get("/api/usage").json()
    assert body["from"] == month_start(now).date().isoformat()
    assert body["to"] == now.date().isoformat()
    assert body["totals"]["tokens"] == 1234
    assert body["budget"] == {
        "monthly_limit": 50_000,
        "used_this_month": 1234,
        "resets_at": next_month_start(now).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "run_limit": 4_000,
        "teams": [],  # in no team with a budget
    }
    Budget.objects.create(user=user, monthly_tokens=0, run_tokens=100)
    budget = api.get("/api/usage").json()["budget"]
    assert (budget["monthly_limit"], budget["run_limit"]) == (0, 100)


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("from=2026-13-01&to=2026-12-31", "invalid"),
        ("from=2026/06/01&to=2026-06-30", "invalid"),
        ("from=yesterday", "invalid"),
        ("from=2026-06-30&to=2026-06-01", "invalid_range"),
        ("from=2025-06-30&to=2026-07-01", "invalid_range"),  # 367 days
    ],
)
def test_bad_dates_get_400(api, query, code):
    response = api.get(f"/api/usage?{query}")
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == code


def test_the_longest_range_is_allowed(api):
    assert MAX_RANGE_DAYS == 366
    response = api.get("/api/usage?from=2025-07-01&to=2026-07-01")
    assert response.status_code == 200
    assert len(response.json()["daily"]) == 366


def test_a_user_sees_only_their_own_usage(api, user, other_user, june):
    assert api.get(f"{JUNE}&user=alice").json()["totals"]["tokens"] == 1100
    assert api.get(f"{JUNE}&user={user.pk}").json()["totals"]["tokens"] == 1100
    for someone in ("mallory", str(other_user.pk), "nobody-at-all"):
        response = api.get(f"{JUNE}&user={someone}")
        assert response.status_code == 403, someone
        assert response.json()["code"] == "forbidden"
    assert api_client_for(other_user).get(JUNE).json()["totals"]["tokens"] == 7777


def test_staff_may_see_anyones_usage(make_user, user, other_user, june):
    staff = api_client_for(make_user("operator", is_staff=True))
    by_name = staff.get(f"{JUNE}&user=alice").json()
    assert by_name["user"] == {"id": user.pk, "username": "alice"}
    assert by_name["totals"]["tokens"] == 1100
    assert staff.get(f"{JUNE}&user={other_user.pk}").json()["totals"]["tokens"] == 7777
    assert staff.get(JUNE).json()["totals"]["tokens"] == 0  # their own by default
    missing = staff.get(f"{JUNE}&user=nobody-at-all")
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"


def test_anonymous_requests_get_401(db):
    assert api_client_for(None).get("/api/usage").status_code == 401
