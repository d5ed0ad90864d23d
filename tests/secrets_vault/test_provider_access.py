"""Models per team: an operator's provider is usable by everyone or by listed teams, and a
team may be limited to some of a provider's models. ``GET /api/providers``, a run's
``llm_provider`` / ``llm_model``, the conversation's and the person's defaults,
``/api/sql/ask`` and the automatic choice all follow the one rule
(``secrets_vault.selectors.provider_grants``); a person's own key is theirs whatever
their teams. Operators set it over ``/api/admin/providers`` (and in the admin)."""

from __future__ import annotations

import sqlite3

import pytest

from conversations.models import Conversation, Run
from paw_project.errors import InvalidRequest
from sandboxes.services import sandbox_spec_for
from secrets_vault.models import CustomProvider, ProviderAccess, ProviderModelLimit
from secrets_vault.providers import models_cache_forget
from secrets_vault.selectors import provider_grants
from secrets_vault.services import (
    custom_provider_save,
    provider_access_set,
    provider_resolve,
    secret_set,
)
from teams.models import Access, Team
from tests.conftest import PASSWORD, SCRIPTED_API_KEY, api_client_for
from tests.factories import datasource_made
from tests.live import wait_for
from tests.processes import free_port
from tests.secrets_vault.conftest import secret_value

MODELS = ["scripted-alpha", "scripted-model", "scripted-zeta"]


def forget_model_lists(scripted_model) -> None:
    """Forget the model lists cached for the scripted model (under any key)."""
    for key in ("", SCRIPTED_API_KEY):
        models_cache_forget(base_url=scripted_model.base_url, api_key=key)


@pytest.fixture
def scripted_provider(settings, scripted_model):
    """The scripted model as the server default (``default``, listing ``MODELS``) and as
    the custom provider ``local`` (no key), the demo offered last; no worker (runs stay
    queued). Cached model lists are forgotten before and after."""

    previous = scripted_model.script
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "models": MODELS})
    forget_model_lists(scripted_model)
    settings.PAW_LLM_BASE_URL = scripted_model.base_url
    settings.PAW_LLM_API_KEY = SCRIPTED_API_KEY
    settings.PAW_LLM_MODEL = "scripted-model"
    settings.PAW_DEMO_BASE_URL = scripted_model.base_url
    custom_provider_save(
        provider=CustomProvider(
            name="local", label="Local", base_url=scripted_model.base_url, known_models=MODELS
        )
    )
    yield scripted_model
    forget_model_lists(scripted_model)
    scripted_model.load(previous)


def team_of(name: str, *members) -> Team:
    team = Team.objects.create(name=name)
    team.user_set.set(members)
    return team


def listed(client) -> dict[str, dict]:
    body = client.get("/api/providers")
    assert body.status_code == 200, body.json()
    return {p["name"]: p for p in body.json()["providers"]}


def start(client, conversation, **body):
    return client.post(
        f"/api/conversations/{conversation.id}/runs", {"prompt": "Hello", **body}, format="json"
    )


pytestmark = pytest.mark.django_db


def test_providers_that_exist_stay_open_to_everyone(make_user, scripted_provider):
    alice = make_user("alice")
    team_of("analysts", alice)
    assert ProviderAccess.objects.count() == 0  # no rule: everyone
    names = list(listed(api_client_for(alice)))
    assert names == ["default", "openai", "anthropic", "gemini", "mistral", "local", "demo"]
    assert listed(api_client_for(make_user("newcomer")))["local"]["models"] == MODELS


def test_a_provider_limited_to_teams_is_listed_and_usable_only_by_their_members(
    make_user, scripted_provider
):
    alice, bob = make_user("alice"), make_user("bob")
    staff = make_user("operator", is_staff=True)
    analysts = team_of("analysts", alice)
    team_of("sales", bob)
    provider_access_set(provider="local", access=Access.TEAMS, team_ids=[analysts.pk])
    assert "local" in listed(api_client_for(alice))
    assert "local" not in listed(api_client_for(bob))
    assert "local" in listed(api_client_for(staff))  # staff always
    conversation = Conversation.objects.create(user=bob)
    refused = start(api_client_for(bob), conversation, llm_provider="local")
    assert refused.status_code == 400, refused.json()
    assert refused.json()["code"] == "provider_not_allowed"
    assert "'local'" in refused.json()["detail"]
    assert not Run.objects.filter(conversation=conversation).exists()
    mine = Conversation.objects.create(user=alice)
    started = start(api_client_for(alice), mine, llm_provider="local", llm_model="scripted-zeta")
    assert started.status_code == 202, started.json()
    assert (started.json()["provider"], started.json()["model"]) == ("local", "scripted-zeta")
    # Taken out of the team, alice loses it at once.
    analysts.user_set.remove(alice)
    assert "local" not in listed(api_client_for(alice))


def test_a_team_limited_to_some_models_sees_and_may_use_only_those(make_user, scripted_provider):
    alice, bob, carol = make_user("alice"), make_user("bob"), make_user("carol")
    interns, seniors = team_of("interns", alice, bob), team_of("seniors", bob)
    team_of("readers", carol)
    provider_access_set(
        provider="default",
        model_limits=[{"team": interns.pk, "models": ["scripted-zeta", "scripted-alpha"]}],
    )
    alice_api = api_client_for(alice)
    default = listed(alice_api)["default"]
    assert default["models"] == ["scripted-alpha", "scripted-zeta"]  # the live list, limited
    assert default["default_model"] == "scripted-zeta"  # scripted-model is not hers
    # bob is also in seniors, which has no limit: every model; carol is in no limited team.
    assert listed(api_client_for(bob))["default"]["models"] == MODELS
    assert listed(api_client_for(carol))["default"]["models"] == MODELS
    conversation = Conversation.objects.create(user=alice)
    refused = start(alice_api, conversation, llm_provider="default", llm_model="scripted-model")
    assert refused.status_code == 400, refused.json()
    assert refused.json()["code"] == "model_not_allowed"
    assert "'scripted-model'" in refused.json()["detail"]
    assert "scripted-zeta, scripted-alpha" in refused.json()["detail"]
    # The automatic choice takes an allowed model of the first provider.
    automatic = start(alice_api, conversation)
    assert automatic.status_code == 202, automatic.json()
    assert (automatic.json()["provider"], automatic.json()["model"]) == ("default", "scripted-zeta")
    # Two limited teams: the union of their models.
    provider_access_set(
        provider="default",
        model_limits=[
            {"team": interns.pk, "models": ["scripted-alpha"]},
            {"team": seniors.pk, "models": ["scripted-model"]},
        ],
    )
    assert listed(api_client_for(bob))["default"]["models"] == ["scripted-alpha", "scripted-model"]
    assert provider_grants(user=alice).allowed_models("default") == ("scripted-alpha",)


def test_the_automatic_choice_and_stored_defaults_never_pick_what_one_may_not_use(
    make_user, scripted_provider
):
    alice = make_user("alice")
    analysts = team_of("analysts", alice)
    alice_api = api_client_for(alice)
    conversation = Conversation.objects.create(user=alice)
    # Before any limit, alice stores the server default as hers and the conversation's.
    assert (
        alice_api.put(
            "/api/providers/default", {"llm_provider": "default", "llm_model": "scripted-model"},
            format="json",
        ).status_code
        == 200
    )  # fmt: skip
    patched = alice_api.patch(
        f"/api/conversations/{conversation.id}", {"llm_provider": "default"}, format="json"
    )
    assert patched.status_code == 200, patched.json()
    # Then the server default is limited to another team, local to her team's one model.
    other = team_of("others")
    provider_access_set(provider="default", access=Access.TEAMS, team_ids=[other.pk])
    provider_access_set(
        provider="local", model_limits=[{"team": analysts.pk, "models": ["scripted-alpha"]}]
    )
    # Both stored defaults are passed over; the first provider she may use decides.
    choice = provider_resolve(user=alice, conversation=Conversation.objects.get(pk=conversation.pk))
    assert (choice.name, choice.model) == ("local", "scripted-alpha")
    started = start(alice_api, conversation)
    assert started.status_code == 202, started.json()
    assert (started.json()["provider"], started.json()["model"]) == ("local", "scripted-alpha")
    # Storing them again now is refused, naming the provider.
    for response in (
        alice_api.put("/api/providers/default", {"llm_provider": "default"}, format="json"),
        alice_api.patch(
            f"/api/conversations/{conversation.id}", {"llm_provider": "default"}, format="json"
        ),
    ):
        assert response.status_code == 400, response.json()
        assert response.json()["code"] == "provider_not_allowed"
        assert "'default'" in response.json()["detail"]
    model = alice_api.patch(
        f"/api/conversations/{conversation.id}",
        {"llm_provider": "local", "llm_model": "scripted-zeta"},
        format="json",
    )
    assert (model.status_code, model.json()["code"]) == (400, "model_not_allowed")


def test_a_persons_own_key_is_theirs_whatever_their_teams(make_user, scripted_provider):
    """A provider with a key secret (here a custom one, unreachable: its known models are
    listed): the operator's global key follows the rule; a person's own key of that name
    is theirs, with every model, whatever their teams."""
    alice, bob = make_user("alice"), make_user("bob")
    analysts = team_of("analysts", bob)
    custom_provider_save(
        provider=CustomProvider(
            name="keyed", base_url=f"http://127.0.0.1:{free_port()}/v1",
            key_secret_name="KEYED_API_KEY", known_models=["m-big", "m-small"],
        )
    )  # fmt: skip
    secret_set(name="KEYED_API_KEY", value=secret_value("sk-global"))  # the operator's
    provider_access_set(
        provider="keyed",
        access=Access.TEAMS,
        team_ids=[analysts.pk],
        model_limits=[{"team": analysts.pk, "models": ["m-small"]}],
    )
    assert "keyed" not in listed(api_client_for(alice))
    bobs = listed(api_client_for(bob))["keyed"]
    assert bobs["active"] and bobs["models"] == ["m-small"] and bobs["default_model"] == "m-small"
    with pytest.raises(InvalidRequest, match="not available to you") as error:
        provider_resolve(user=alice, llm_provider="keyed")
    assert error.value.code == "provider_not_allowed"
    # Her own key: listed, active, every model, used for her runs only.
    own = secret_value("sk-own")
    secret_set(name="KEYED_API_KEY", value=own, user=alice)
    hers = listed(api_client_for(alice))["keyed"]
    assert hers["active"] and hers["models"] == ["m-big", "m-small"]
    choice = provider_resolve(user=alice, llm_provider="keyed", llm_model="m-big")
    assert choice.api_key == own
    # bob's own key lifts his team's model limit too.
    secret_set(name="KEYED_API_KEY", value=secret_value("sk-bob"), user=bob)
    assert listed(api_client_for(bob))["keyed"]["models"] == ["m-big", "m-small"]


def test_sql_ask_follows_the_providers_rule(make_user, scripted_provider, tmp_path):
    alice = make_user("alice")
    analysts = team_of("analysts", alice)
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
    datasource_made(slug="shop", name="Shop", dialect="sqlite", connection={"database": str(path)})
    provider_access_set(provider="local", access=Access.TEAMS, team_ids=[])
    provider_access_set(
        provider="default", model_limits=[{"team": analysts.pk, "models": ["scripted-alpha"]}]
    )
    alice_api = api_client_for(alice)
    before = (Conversation.objects.count(), Run.objects.count())
    for body, code in (
        ({"llm_provider": "local"}, "provider_not_allowed"),
        ({"llm_provider": "default", "llm_model": "scripted-model"}, "model_not_allowed"),
    ):
        response = alice_api.post(
            "/api/sql/ask", {"datasource": "shop", "question": "How many?", **body}, format="json"
        )
        assert (response.status_code, response.json()["code"]) == (400, code), response.json()
    assert (Conversation.objects.count(), Run.objects.count()) == before
    asked = alice_api.post(
        "/api/sql/ask", {"datasource": "shop", "question": "How many?"}, format="json"
    )
    assert asked.status_code == 202, asked.json()
    assert (asked.json()["provider"], asked.json()["model"]) == ("default", "scripted-alpha")


def test_operators_set_access_over_rest(make_user, scripted_provider):
    staff = make_user("operator", is_staff=True, is_superuser=True)
    alice = make_user("alice")
    analysts, sales = team_of("analysts", alice), team_of("sales")
    admin_api = api_client_for(staff)
    everything = admin_api.get("/api/admin/providers").json()["providers"]
    assert [p["provider"] for p in everything] == [
        "default", "openai", "anthropic", "gemini", "mistral", "local", "demo"
    ]  # fmt: skip
    assert everything[5] == {
        "provider": "local", "label": "Local", "known": True, "access": "everyone",
        "teams": [], "model_limits": [],
    }  # fmt: skip
    answer = admin_api.patch(
        "/api/admin/providers/local",
        {
            "access": "teams",
            "teams": [sales.pk, analysts.pk],
            "model_limits": [{"team": analysts.pk, "models": ["scripted-alpha"]}],
        },
        format="json",
    )
    assert answer.status_code == 200, answer.json()
    assert answer.json() == {
        "provider": "local", "label": "Local", "known": True, "access": "teams",
        "teams": [{"id": analysts.pk, "name": "analysts"}, {"id": sales.pk, "name": "sales"}],
        "model_limits": [
            {"team": analysts.pk, "team_name": "analysts", "models": ["scripted-alpha"]}
        ],
    }  # fmt: skip
    assert listed(api_client_for(alice))["local"]["models"] == ["scripted-alpha"]
    assert admin_api.get("/api/admin/providers/local").json() == answer.json()
    # Errors change nothing.
    for body, status, code in (
        ({"teams": [999999]}, 400, "unknown_team"),
        ({"access": "some"}, 400, "invalid_choice"),
        ({"model_limits": [{"team": sales.pk, "models": []}]}, 400, "min_length"),
        ({"model_limits": [{"team": 999999, "models": ["x"]}]}, 400, "unknown_team"),
        ({"model_limits": [{"team": sales.pk, "models": ["a"]},
                           {"team": sales.pk, "models": ["b"]}]}, 400, "invalid_models"),
        ({"who": "me"}, 400, "unknown_field"),
    ):  # fmt: skip
        refused = admin_api.patch("/api/admin/providers/local", body, format="json")
        assert (refused.status_code, refused.json()["code"]) == (status, code), refused.json()
    assert admin_api.get("/api/admin/providers/local").json() == answer.json()
    missing = admin_api.patch("/api/admin/providers/nope", {"access": "teams"}, format="json")
    assert (missing.status_code, missing.json()["code"]) == (404, "provider_not_found")
    assert admin_api.get("/api/admin/providers/nope").status_code == 404
    assert api_client_for(alice).get("/api/admin/providers").status_code == 403
    assert api_client_for(alice).patch(
        "/api/admin/providers/local", {"access": "everyone"}, format="json"
    ).status_code == 403  # fmt: skip
    # Opening it again: everyone, and the limits removed with [].
    admin_api.patch(
        "/api/admin/providers/local", {"access": "everyone", "model_limits": []}, format="json"
    )
    assert listed(api_client_for(make_user("newcomer")))["local"]["models"] == MODELS
    assert not ProviderModelLimit.objects.exists()


def test_a_renamed_custom_provider_keeps_its_rule_and_the_admin_sets_one(
    make_user, scripted_provider, client
):
    alice = make_user("alice")
    analysts = team_of("analysts")
    provider_access_set(provider="local", access=Access.TEAMS, team_ids=[analysts.pk])
    local = CustomProvider.objects.get(name="local")
    local.name = "ollama"
    custom_provider_save(provider=local)
    assert ProviderAccess.objects.get().provider == "ollama"
    assert "ollama" not in listed(api_client_for(alice))
    # The admin: the rule's page offers the providers that exist; the team's page shows it.
    make_user("operator", is_staff=True, is_superuser=True)
    client.login(username="operator", password=PASSWORD)
    rule = ProviderAccess.objects.get()
    page = client.get(f"/admin/secrets_vault/provideraccess/{rule.pk}/change/")
    assert page.status_code == 200
    assert b'<option value="ollama" selected>' in page.content
    assert b'<option value="demo">' in page.content
    team_page = client.get(f"/admin/teams/team/{analysts.pk}/change/")
    assert b"providers this team may use" in team_page.content.lower()
    added = client.post(
        "/admin/secrets_vault/provideraccess/add/",
        {
            "provider": "mistral", "access": "teams", "teams": [analysts.pk],
            "model_limits-TOTAL_FORMS": "1", "model_limits-INITIAL_FORMS": "0",
            "model_limits-0-team": str(analysts.pk),
            "model_limits-0-allowed_models": '["mistral-small-latest"]',
        },
    )  # fmt: skip
    assert added.status_code == 302, added.content[:3000]
    analysts.user_set.add(alice)
    secret_set(name="MISTRAL_API_KEY", value=secret_value("sk-mistral"))
    assert listed(api_client_for(alice))["mistral"]["models"] == ["mistral-small-latest"]


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_a_run_on_a_teams_model_is_answered_by_it_through_the_worker(
    celery_worker, scripted_model, make_user, request
):
    """Through a real worker and paw-agent: the run a limited team's member starts runs on
    the team's model, as chosen (the worker checks the choice again at dispatch)."""
    alice = make_user("alice")
    analysts = team_of("analysts", alice)
    scripted_model.load(
        {"api_key": SCRIPTED_API_KEY, "models": MODELS, "untooled": "Title",
         "responses": ["The team's model answers."]}
    )  # fmt: skip
    forget_model_lists(scripted_model)
    request.addfinalizer(lambda: forget_model_lists(scripted_model))
    scripted_model.clear_log()  # what earlier tests of the session sent
    provider_access_set(
        provider="default", model_limits=[{"team": analysts.pk, "models": ["scripted-zeta"]}]
    )
    alice_api = api_client_for(alice)
    conversation = alice_api.post("/api/conversations", {}, format="json").json()
    started = alice_api.post(
        f"/api/conversations/{conversation['id']}/runs", {"prompt": "Hello"}, format="json"
    )
    assert started.status_code == 202, started.json()
    url = f"/api/conversations/{conversation['id']}/runs/{started.json()['id']}"
    run = wait_for(
        lambda: (r := alice_api.get(url).json())["status"] in ("done", "error") and r,
        timeout=60,
        what="the run to end",
    )
    assert run["status"] == "done", run
    assert (run["provider"], run["model"]) == ("default", "scripted-zeta")
    assert "The team's model answers." in run["answer"]
    sent = [body.get("model") for body in scripted_model.requests if body.get("messages")]
    assert "scripted-zeta" in sent and "scripted-model" not in sent, sent


def test_the_worker_checks_the_choice_again_when_the_run_starts(make_user, scripted_provider):
    """A run queued while its provider was allowed, whose access is taken away before a
    worker picks it up, is refused at dispatch (the sandbox's spec), naming the provider."""
    alice = make_user("alice")
    analysts = team_of("analysts", alice)
    provider_access_set(provider="local", access=Access.TEAMS, team_ids=[analysts.pk])
    conversation = Conversation.objects.create(user=alice)
    started = start(api_client_for(alice), conversation, llm_provider="local")
    assert started.status_code == 202, started.json()
    analysts.user_set.remove(alice)
    run = Run.objects.select_related("user", "conversation").get(id=started.json()["id"])
    with pytest.raises(InvalidRequest, match="'local'") as refused:
        sandbox_spec_for(run)
    assert refused.value.code == "provider_not_allowed"
