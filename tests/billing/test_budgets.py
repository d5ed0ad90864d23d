"""Budgets at a run's start: 402 ``budget_exhausted`` once the month's tokens reach the
limit, not one token before; per-user budgets override the server's; months are UTC."""

from __future__ import annotations

from datetime import datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from billing.models import Budget
from billing.selectors import budget_limits, budget_status, month_start, next_month_start
from billing.services import RunBudgetGuard
from conversations.models import Run
from tests.billing.ledger import at, ledger_event
from tests.conftest import SCRIPTED_API_KEY
from tests.factories import conversation_of

pytestmark = pytest.mark.django_db

LIMIT = 1_000


@pytest.fixture
def configured(settings, scripted_model):
    """A default provider (no worker: the runs stay queued) and a monthly budget."""
    settings.PAW_LLM_BASE_URL = scripted_model.base_url
    settings.PAW_LLM_API_KEY = SCRIPTED_API_KEY
    settings.PAW_LLM_MODEL = "scripted-model"
    settings.PAW_BUDGET_MONTHLY_TOKENS = LIMIT
    settings.PAW_BUDGET_RUN_TOKENS = 0


def start(api, conversation):
    return api.post(
        f"/api/conversations/{conversation.id}/runs", {"prompt": "Go on."}, format="json"
    )


def test_a_run_cannot_start_once_the_monthly_budget_is_used_up(api, user, configured):
    conversation = conversation_of(user)
    ledger_event(user=user, input_tokens=900, output_tokens=100)  # exactly the limit
    response = start(api, conversation)
    assert response.status_code == 402, response.json()
    body = response.json()
    assert body["code"] == "budget_exhausted"
    assert (body["used"], body["limit"]) == (LIMIT, LIMIT)
    reset = next_month_start(timezone.now())
    assert body["resets_at"] == reset.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert reset.day == 1 and reset > timezone.now()
    assert body["detail"]
    assert not Run.objects.filter(conversation=conversation).exists()


def test_a_user_one_token_under_the_limit_can_start(api, user, configured):
    conversation = conversation_of(user)
    ledger_event(user=user, input_tokens=900, output_tokens=99)
    response = start(api, conversation)
    assert response.status_code == 202, response.json()


def test_last_months_tokens_do_not_count(api, user, configured):
    conversation = conversation_of(user)
    ledger_event(
        user=user,
        input_tokens=10 * LIMIT,
        created=month_start(timezone.now()) - timedelta(microseconds=1),
    )
    ledger_event(user=user, input_tokens=LIMIT - 1, created=month_start(timezone.now()))
    assert start(api, conversation).status_code == 202


def test_a_users_own_budget_overrides_the_servers(api, user, other_user, configured):
    conversation = conversation_of(user)
    ledger_event(user=user, input_tokens=LIMIT)
    Budget.objects.create(user=user, monthly_tokens=0)  # unlimited for this user
    assert start(api, conversation).status_code == 202
    Budget.objects.filter(user=user).update(monthly_tokens=LIMIT + 1)
    Run.objects.filter(conversation=conversation).delete()
    assert start(api, conversation).status_code == 202
    Budget.objects.filter(user=user).update(monthly_tokens=LIMIT)
    Run.objects.filter(conversation=conversation).delete()
    assert start(api, conversation).status_code == 402
    # Another user's tokens never count against this one.
    ledger_event(user=other_user, input_tokens=10 * LIMIT)
    Budget.objects.filter(user=user).update(monthly_tokens=None)  # back to the server's
    assert budget_limits(user_id=user.pk).monthly == LIMIT
    assert budget_limits(user_id=other_user.pk).monthly == LIMIT


def test_without_a_limit_anything_goes(api, user, configured, settings):
    settings.PAW_BUDGET_MONTHLY_TOKENS = 0
    conversation = conversation_of(user)
    ledger_event(user=user, input_tokens=10**9)
    assert start(api, conversation).status_code == 202


def test_the_month_is_the_calendar_month_in_utc(user, settings):
    settings.TIME_ZONE = "Pacific/Auckland"  # the server's zone plays no part
    settings.PAW_BUDGET_MONTHLY_TOKENS = 5_000
    ledger_event(user=user, input_tokens=1, created=at("2026-06-30T23:59:59.999999"))
    ledger_event(user=user, input_tokens=10, created=at("2026-07-01T00:00:00"))
    ledger_event(user=user, input_tokens=100, created=at("2026-07-31T23:59:59"))
    ledger_event(user=user, input_tokens=1000, created=at("2026-08-01T00:00:00"))
    status = budget_status(user_id=user.pk, now=at("2026-07-15T12:00:00"))
    assert status == {
        "monthly_limit": 5_000,
        "used_this_month": 10 + 100,
        "resets_at": at("2026-08-01T00:00:00"),
        "run_limit": settings.PAW_BUDGET_RUN_TOKENS,
        "teams": [],  # in no team with a budget
    }
    # 01:00 on 1 July in Berlin (UTC+2) is still June in UTC.
    berlin = datetime(2026, 7, 1, 1, 0, tzinfo=ZoneInfo("Europe/Berlin"))
    assert month_start(berlin) == at("2026-06-01T00:00:00")
    assert next_month_start(berlin) == at("2026-07-01T00:00:00")
    assert next_month_start(at("2026-12-31T23:59:59")) == at("2027-01-01T00:00:00")


def test_the_run_guard_counts_the_users_other_runs_going_on(user, other_user, settings):
    settings.PAW_BUDGET_MONTHLY_TOKENS = 1_000
    settings.PAW_BUDGET_RUN_TOKENS = 700
    ledger_event(user=user, input_tokens=100)
    a, b = (
        Run.objects.create(conversation=conversation_of(user), user=user, prompt="p")
        for _ in range(2)
    )
    elsewhere = Run.objects.create(
        conversation=conversation_of(other_user), user=other_user, prompt="p"
    )
    guard = RunBudgetGuard()
    assert guard.check(run_id=a.id, user_id=a.user_id, usage={"input": 600, "output": 0}) is None
    assert (
        guard.check(
            run_id=elsewhere.id, user_id=elsewhere.user_id, usage={"input": 650, "output": 0}
        )
        is None
    )
    assert (
        guard.check(run_id=b.id, user_id=b.user_id, usage={"input": 250, "output": 50}) is None
    )  # 100+600+300
    reason = guard.check(
        run_id=b.id, user_id=b.user_id, usage={"input": 250, "output": 51}
    )  # one token past
    assert reason and "monthly token budget of 1000 tokens" in reason and "(1001 tokens" in reason
    # A run that ended stays counted (as the ledger will say) until the next refresh.
    guard.forget(a.id)
    assert (
        guard.check(run_id=b.id, user_id=b.user_id, usage={"input": 250, "output": 51}) is not None
    )
    # The run budget: past it, not at it.
    assert (
        guard.check(
            run_id=elsewhere.id, user_id=elsewhere.user_id, usage={"input": 700, "output": 0}
        )
        is None
    )
    reason = guard.check(
        run_id=elsewhere.id, user_id=elsewhere.user_id, usage={"input": 700, "output": 1}
    )
    assert reason and "701 tokens" in reason and "700 tokens per run" in reason


def test_demo_usage_counts_against_no_budget(api, user, configured, settings, scripted_model):
    """The offline demo's runs (provider ``demo``) start with the month's budget used up,
    and their ledger rows, marked ``demo``, are left out of what budgets count."""
    settings.PAW_DEMO_BASE_URL = scripted_model.base_url
    ledger_event(user=user, input_tokens=900, output_tokens=100)  # exactly the limit
    ledger_event(user=user, input_tokens=5_000, provider="demo", demo=True)
    assert budget_status(user_id=user.pk)["used_this_month"] == LIMIT  # not 6000
    conversation = conversation_of(user)
    refused = start(api, conversation)
    assert refused.status_code == 402, refused.json()
    demo = api.post(
        f"/api/conversations/{conversation.id}/runs",
        {"prompt": "Go on.", "llm_provider": "demo", "llm_model": "scripted-demo"},
        format="json",
    )
    assert demo.status_code == 202, demo.json()
    assert Run.objects.get(id=demo.json()["id"]).provider == "demo"


def test_the_run_guard_never_stops_a_demo_run_nor_counts_it_for_others(user, settings):
    settings.PAW_BUDGET_MONTHLY_TOKENS = 1_000
    settings.PAW_BUDGET_RUN_TOKENS = 700
    demo, real = (
        Run.objects.create(conversation=conversation_of(user), user=user, prompt="p", provider=p)
        for p in ("demo", "default")
    )
    guard = RunBudgetGuard()
    assert guard.check(run_id=demo.id, user_id=user.pk, usage={"input": 5_000, "output": 0}) is None
    assert guard.check(run_id=real.id, user_id=user.pk, usage={"input": 650, "output": 0}) is None
    guard.forget(demo.id)  # its tokens move to nobody's "used before"
    assert guard.check(run_id=real.id, user_id=user.pk, usage={"input": 700, "output": 0}) is None
    reason = guard.check(run_id=real.id, user_id=user.pk, usage={"input": 700, "output": 1})
    assert reason and "700 tokens per run" in reason
