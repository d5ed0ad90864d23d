"""Budgets per team: a team's monthly token budget counts its members' usage while they
were members (each ledger row records its user's teams); a run is refused at its start
(402 naming the team) and stopped during it (``budget_exceeded`` naming the team, through
a real worker and paw-agent on the scripted model) once the person's own budget or any
of their teams' is spent; ``/api/usage``, ``/usage/`` and the admin show the teams'
months; operators set a team's budget over REST."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from billing.models import TeamBudget, UsageEvent
from billing.selectors import budget_status, month_start, next_month_start, team_tokens_used
from billing.services import RunBudgetGuard, usage_record
from conversations.models import Run
from conversations.services.runs import run_start
from teams.models import Team
from tests.billing.ledger import ledger_event
from tests.billing.test_ledger_runtime import LOOP, assert_billed_as_run, finished
from tests.conftest import PASSWORD, SCRIPTED_API_KEY, api_client_for
from tests.factories import conversation_of
from tests.live import wait_for

LIMIT = 1_000


@pytest.fixture
def configured(settings, scripted_model):
    """A default provider (no worker: the runs stay queued), no personal limits."""
    settings.PAW_LLM_BASE_URL = scripted_model.base_url
    settings.PAW_LLM_API_KEY = SCRIPTED_API_KEY
    settings.PAW_LLM_MODEL = "scripted-model"
    settings.PAW_BUDGET_MONTHLY_TOKENS = 0
    settings.PAW_BUDGET_RUN_TOKENS = 0


def team_of(name: str, *members, monthly_tokens: int | None = None) -> Team:
    team = Team.objects.create(name=name)
    team.user_set.set(members)
    if monthly_tokens is not None:
        TeamBudget.objects.create(team=team, monthly_tokens=monthly_tokens)
    return team


def team_event(user, team_list, tokens: int, **fields) -> UsageEvent:
    """A ledger row of ``user`` counted against ``team_list`` (as usage_record writes)."""
    event = ledger_event(user=user, input_tokens=tokens, **fields)
    event.teams.set(team_list)
    return event


def start(api, conversation, **body):
    return api.post(
        f"/api/conversations/{conversation.id}/runs", {"prompt": "Go on.", **body}, format="json"
    )


@pytest.mark.django_db
def test_a_run_is_refused_at_its_start_once_a_teams_budget_is_spent(
    api, user, make_user, configured, settings, scripted_model
):
    bob = make_user("bob")
    analysts = team_of("analysts", user, bob, monthly_tokens=LIMIT)
    team_of("readers", user)  # no budget: never in the way
    team_event(bob, [analysts], 600)  # the team's usage is its members', bob's too
    team_event(user, [analysts], 399)
    conversation = conversation_of(user)
    assert start(api, conversation).status_code == 202  # one token under
    Run.objects.filter(conversation=conversation).delete()
    team_event(bob, [analysts], 1)
    refused = start(api, conversation)
    assert refused.status_code == 402, refused.json()
    body = refused.json()
    reset = next_month_start(timezone.now())
    assert body == {
        "detail": f"The monthly token budget of team analysts is used up ({LIMIT} of {LIMIT} "
        f"tokens); it resets on {reset:%Y-%m-%d} (UTC).",
        "code": "budget_exhausted",
        "used": LIMIT,
        "limit": LIMIT,
        "resets_at": reset.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "team": {"id": analysts.pk, "name": "analysts"},
    }
    assert not Run.objects.filter(conversation=conversation).exists()
    # Someone outside the team is not held back by it; the offline demo never is.
    carol = make_user("carol")
    assert start(api_client_for(carol), conversation_of(carol)).status_code == 202
    settings.PAW_DEMO_BASE_URL = scripted_model.base_url
    demo = start(api, conversation, llm_provider="demo")
    assert demo.status_code == 202, demo.json()
    Run.objects.filter(conversation=conversation).delete()
    # A budget of 0 is none: unlimited.
    TeamBudget.objects.filter(team=analysts).update(monthly_tokens=0)
    assert start(api, conversation).status_code == 202


@pytest.mark.django_db
def test_a_team_counts_its_members_usage_only_while_they_were_members(user, make_user, configured):
    """Usage rows record the teams of their user when the run ended: joining a team later
    brings no earlier usage to it, and leaving keeps what was used as a member."""
    bob = make_user("bob")
    analysts = team_of("analysts", bob, monthly_tokens=LIMIT)
    conversation = conversation_of(user)
    # alice's run before she joins: written by the ledger's own service.
    before = Run.objects.create(
        conversation=conversation, user=user, prompt="p", status=Run.Status.DONE,
        usage={"input": 300, "output": 0, "rounds": 1}, provider="default", model="m",
    )  # fmt: skip
    assert list(usage_record(run=before).teams.all()) == []
    analysts.user_set.add(user)
    during = Run.objects.create(
        conversation=conversation, user=user, prompt="p", status=Run.Status.DONE,
        usage={"input": 40, "output": 2, "rounds": 1}, provider="default", model="m",
    )  # fmt: skip
    assert list(usage_record(run=during).teams.all()) == [analysts]
    since = month_start(timezone.now())
    assert team_tokens_used(team_id=analysts.pk, since=since) == 42
    analysts.user_set.remove(user)
    after = Run.objects.create(
        conversation=conversation, user=user, prompt="p", status=Run.Status.DONE,
        usage={"input": 500, "output": 0, "rounds": 1}, provider="default", model="m",
    )  # fmt: skip
    usage_record(run=after)
    assert team_tokens_used(team_id=analysts.pk, since=since) == 42  # kept, nothing added
    # Last month's rows and the demo's do not count.
    team_event(bob, [analysts], 10_000, created=since - timedelta(seconds=1))
    team_event(bob, [analysts], 10_000, provider="demo", demo=True)
    assert team_tokens_used(team_id=analysts.pk, since=since) == 42


@pytest.mark.django_db
def test_the_usage_api_and_page_show_the_teams_budgets_beside_ones_own(
    api, client, user, make_user, configured, settings
):
    settings.PAW_BUDGET_MONTHLY_TOKENS = 50_000
    analysts = team_of("analysts", user, monthly_tokens=2_000)
    team_of("unlimited", user, monthly_tokens=0)  # 0: no budget, not listed
    team_of("others", make_user("bob"), monthly_tokens=500)  # not alice's team
    team_event(user, [analysts], 1_500)
    budget = api.get("/api/usage").json()["budget"]
    reset = next_month_start(timezone.now()).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert budget["monthly_limit"] == 50_000 and budget["used_this_month"] == 1_500
    assert budget["teams"] == [
        {
            "id": analysts.pk,
            "name": "analysts",
            "monthly_limit": 2_000,
            "used_this_month": 1_500,
            "resets_at": reset,
        }
    ]
    client.login(username=user.username, password=PASSWORD)
    page = client.get("/usage/").content.decode()
    assert "Your teams&#x27; budgets this month" in page or "Your teams' budgets this month" in page
    assert 'data-team="analysts"' in page and 'data-team="unlimited"' not in page
    assert "1,500</span> of" in page and "2,000</span> tokens used (75%)" in page
    assert 'data-team="others"' not in page


@pytest.mark.django_db
def test_operators_set_a_teams_budget_over_rest_and_see_its_month(
    user, make_user, configured, client
):
    staff = make_user("operator", is_staff=True, is_superuser=True)
    admin_api = api_client_for(staff)
    analysts = team_of("analysts", user)
    url = f"/api/admin/teams/{analysts.pk}/budget"
    reset = next_month_start(timezone.now()).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert admin_api.get(url).json() == {
        "id": analysts.pk, "name": "analysts", "monthly_limit": 0, "used_this_month": 0,
        "resets_at": reset,
    }  # fmt: skip
    team_event(user, [analysts], 120)
    answer = admin_api.put(url, {"monthly_tokens": 5_000}, format="json")
    assert answer.status_code == 200, answer.json()
    assert (answer.json()["monthly_limit"], answer.json()["used_this_month"]) == (5_000, 120)
    assert TeamBudget.objects.get(team=analysts).monthly_tokens == 5_000
    for bad, code in (({"monthly_tokens": -1}, "min_value"), ({"monthly_tokens": "9"}, "invalid"),
                      ({"monthly": 9}, "unknown_field")):  # fmt: skip
        refused = admin_api.put(url, bad, format="json")
        assert refused.status_code == 400 and refused.json()["code"] == code, refused.json()
    assert TeamBudget.objects.get(team=analysts).monthly_tokens == 5_000  # unchanged
    assert admin_api.get("/api/admin/teams/999999/budget").json()["code"] == "team_not_found"
    assert api_client_for(user).get(url).status_code == 403  # staff only
    # The admin shows each team's month: on the team's page and in the list of budgets.
    client.login(username="operator", password=PASSWORD)
    team_page = client.get(f"/admin/teams/team/{analysts.pk}/change/").content.decode()
    assert "120 of 5000 tokens" in team_page
    listing = client.get("/admin/billing/teambudget/").content.decode()
    assert "analysts" in listing and "120 of 5000 tokens" in listing


@pytest.mark.django_db
def test_the_run_guard_counts_the_teams_other_runs_and_names_the_team(user, make_user, configured):
    bob, carol = make_user("bob"), make_user("carol")
    analysts = team_of("analysts", user, bob, monthly_tokens=1_000)
    team_event(carol, [analysts], 100)  # carol was a member earlier this month
    mine, bobs = (
        Run.objects.create(conversation=conversation_of(who), user=who, prompt="p")
        for who in (user, bob)
    )
    guard = RunBudgetGuard()
    assert guard.check(run_id=bobs.id, user_id=bob.pk, usage={"input": 600, "output": 0}) is None
    assert guard.check(run_id=mine.id, user_id=user.pk, usage={"input": 300, "output": 0}) is None
    reason = guard.check(run_id=mine.id, user_id=user.pk, usage={"input": 300, "output": 1})
    assert reason == (
        "The monthly token budget of team analysts (1000 tokens) is used up (1001 tokens this "
        "month by its members), so PAW stopped the run; it resets on "
        f"{next_month_start(timezone.now()):%Y-%m-%d} (UTC)."
    )
    # bob's run that ended stays counted for alice's (as the ledger will say).
    guard.forget(bobs.id)
    assert guard.check(run_id=mine.id, user_id=user.pk, usage={"input": 300, "output": 1})
    assert budget_status(user_id=user.pk)["teams"][0]["used_this_month"] == 100


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_running_run_is_stopped_once_its_teams_budget_is_passed(
    celery_worker, scripted_model, make_user
):
    """Through a real worker node and paw-agent: the model loops on tools until PAW stops
    the run for the team's budget; it ends ``error`` ``budget_exceeded`` naming the team,
    billed past the limit, and its ledger row counts against the team."""
    scripted_model.load(LOOP)
    alice, bob = make_user("alice"), make_user("bob")
    analysts = team_of("analysts", alice, bob, monthly_tokens=500)
    team_event(bob, [analysts], 300)  # 300 of the team's 500 used by bob
    conversation = conversation_of(alice)
    run = run_start(user=alice, conversation_id=conversation.id, prompt="Loop.")
    run = wait_for(lambda: finished(run.id), timeout=30, what="the run to be stopped")
    assert run.status == Run.Status.ERROR, run.errors
    assert run.errors[0]["code"] == "budget_exceeded", run.errors
    assert "team analysts (500 tokens)" in run.errors[0]["message"], run.errors
    event = assert_billed_as_run(run)
    assert 300 + event.tokens > 500 and event.rounds < 10
    assert list(event.teams.all()) == [analysts]
    # Now spent: the next run of any member is refused at its start, naming the team.
    refused = start(api_client_for(bob), conversation_of(bob))
    assert refused.status_code == 402 and "team analysts" in refused.json()["detail"]
