"""The chat page's model picker follows the providers' access rule: a provider limited to
other teams is not offered, a team limited to some models sees only those (and the
automatic choice is one of them), and a run started from the picker uses the chosen
model. A real web process and worker, paw-agent on the scripted model, Chromium."""

from __future__ import annotations

import json

import pytest

from conversations.models import Conversation, Run
from secrets_vault.models import CustomProvider
from secrets_vault.providers import models_cache_forget
from secrets_vault.services import custom_provider_save, provider_access_set
from teams.models import Access, Team
from tests.conftest import SCRIPTED_API_KEY
from tests.conversations.conftest import BrowserSession
from tests.live import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]

MODELS = ["scripted-alpha", "scripted-model", "scripted-zeta"]


@pytest.fixture
def team_models(scripted_model, make_user):
    """The scripted model listing ``MODELS`` (the chat server's default provider) and a
    custom provider ``local`` on it limited to the team *sales*; alice is in *interns*,
    limited to two models of the server default; bob is in *sales*, unlimited."""

    def forget() -> None:
        for key in ("", SCRIPTED_API_KEY):
            models_cache_forget(base_url=scripted_model.base_url, api_key=key)

    previous = scripted_model.script
    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "models": MODELS, "untooled": "Title",
         "responses": ["Answered by the team's model."]}
    )  # fmt: skip
    forget()
    scripted_model.clear_log()
    alice, bob = make_user("alice"), make_user("bob")
    interns, sales = Team.objects.create(name="interns"), Team.objects.create(name="sales")
    interns.user_set.add(alice)
    sales.user_set.add(bob)
    custom_provider_save(
        provider=CustomProvider(
            name="local", label="Local models", base_url=scripted_model.base_url,
            known_models=MODELS,
        )
    )  # fmt: skip
    provider_access_set(provider="local", access=Access.TEAMS, team_ids=[sales.pk])
    provider_access_set(
        provider="default",
        model_limits=[{"team": interns.pk, "models": ["scripted-zeta", "scripted-alpha"]}],
    )
    yield alice, bob
    forget()
    scripted_model.load(previous)


def picker_of(page) -> tuple[list[str], dict[str, list[str]], str]:
    """The picker as shown: the option texts, each group's label with its models, and
    the automatic option's text."""
    page.wait_for_function("() => document.querySelectorAll('#model-picker optgroup').length > 0")
    groups = page.eval_on_selector_all(
        "#model-picker optgroup",
        "(nodes) => nodes.map((g) => [g.label, [...g.querySelectorAll('option')].map((o) => o.textContent)])",
    )
    automatic = page.locator("#model-picker option").first.text_content()
    return [label for label, _ in groups], dict(groups), automatic


def test_the_picker_offers_only_what_ones_teams_may_use_and_the_run_uses_it(
    browser_session, team_models, scripted_model
):
    alice, bob = team_models
    browser_session.sign_in_as(alice)
    conversation = Conversation.objects.create(user=alice)
    page = browser_session.page
    page.goto(browser_session.url(f"/c/{conversation.id}/"))
    page.wait_for_selector(".connection[data-state=connected]")
    labels, groups, automatic = picker_of(page)
    assert "Local models" not in labels, labels  # limited to sales: not offered
    assert groups["Server default"] == ["scripted-alpha", "scripted-zeta"], groups
    assert automatic == "Automatic: Server default", automatic
    # Pick one of her models and ask: the run is answered by that model.
    zeta = json.dumps(["default", "scripted-zeta"], separators=(",", ":"))  # as the page writes it
    page.select_option("#model-picker", value=zeta)
    wait_for(
        lambda: Conversation.objects.get(id=conversation.id).llm_model == "scripted-zeta",
        what="the choice saved",
    )
    page.get_by_label("Message to the agent").fill("Hello")
    page.get_by_label("Message to the agent").press("Enter")
    page.locator(".answer", has_text="Answered by the team's model.").wait_for(timeout=60_000)
    run = Run.objects.get(conversation=conversation)
    assert (run.provider, run.model) == ("default", "scripted-zeta")
    sent = [body.get("model") for body in scripted_model.requests]
    assert "scripted-zeta" in sent and "scripted-model" not in sent, sent

    # bob, in sales: the local provider and every model of the server default.
    other = browser_session.context.browser.new_context(viewport={"width": 1280, "height": 900})
    try:
        bobs = BrowserSession(other, browser_session.server)
        bobs.sign_in_as(bob)
        bobs.page.goto(bobs.url("/"))
        labels, groups, _ = picker_of(bobs.page)
        assert groups["Local models"] == MODELS, groups
        assert groups["Server default"] == MODELS, groups
    finally:
        other.close()
