"""A team's budget in the chat page: a run refused at its start says which team's budget
is spent, and a run stopped during it for the team's budget says so in the transcript. A
real web process and worker, paw-agent on the scripted model, Chromium."""

from __future__ import annotations

import pytest

from billing.models import TeamBudget
from conversations.models import Conversation, Run
from teams.models import Team
from tests.billing.ledger import ledger_event
from tests.billing.test_ledger_runtime import LOOP

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]


def test_the_chat_names_the_team_whose_budget_refused_or_stopped_a_run(
    browser_session, scripted_model, make_user
):
    scripted_model.load(LOOP)  # a model looping on tools: only a budget stops it
    alice = make_user("alice")
    analysts = Team.objects.create(name="analysts")
    analysts.user_set.add(alice)
    TeamBudget.objects.create(team=analysts, monthly_tokens=500)
    spent = ledger_event(user=make_user("bob"), input_tokens=500)  # bob, a member earlier
    spent.teams.add(analysts)
    browser_session.sign_in_as(alice)
    conversation = Conversation.objects.create(user=alice)
    page = browser_session.page
    page.goto(browser_session.url(f"/c/{conversation.id}/"))
    page.wait_for_selector(".connection[data-state=connected]")
    page.get_by_label("Message to the agent").fill("Loop.")
    page.get_by_label("Message to the agent").press("Enter")
    error = page.locator("#composer-error")
    error.wait_for()
    assert "monthly token budget of team analysts is used up (500 of 500" in error.inner_text()
    assert not Run.objects.filter(conversation=conversation).exists()
    # More budget: the run starts, and is stopped once the team's month passes it.
    TeamBudget.objects.filter(team=analysts).update(monthly_tokens=800)
    page.get_by_label("Message to the agent").fill("Loop.")
    page.get_by_label("Message to the agent").press("Enter")
    stopped = page.locator(".run-error", has_text="team analysts (800 tokens)")
    stopped.wait_for(timeout=60_000)
    assert "The token budget ran out" in stopped.inner_text()
    run = Run.objects.get(conversation=conversation)
    assert (run.status, run.errors[0]["code"]) == (Run.Status.ERROR, "budget_exceeded")
