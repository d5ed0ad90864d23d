"""Providers: activation by a user's or a global key (never the server's environment),
live model lists with a cache and a fallback, and the choice of a run's provider/model."""

from __future__ import annotations

import json
import secrets as pysecrets
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.test import override_settings

from conversations.models import Conversation
from paw_project.errors import InvalidRequest
from secrets_vault.models import CustomProvider, Secret
from secrets_vault.providers import BUILTIN_PROVIDERS, models_cache_forget
from secrets_vault.selectors import provider_list, providers_for
from secrets_vault.services import (
    custom_provider_save,
    provider_default_set,
    provider_resolve,
    secret_set,
)
from tests.conftest import SCRIPTED_API_KEY
from tests.processes import free_port
from tests.secrets_vault.conftest import secret_value

# --- A tiny OpenAI-compatible `GET /v1/models` endpoint, local to this module -----------


@dataclass
class ModelsServer:
    """Serves ``GET <base>/models`` with ``models``; answers 401 when ``required_key`` is
    set and the request's bearer token differs. ``requests`` logs (path, Authorization)."""

    models: list[str]
    required_key: str = ""
    requests: list[tuple[str, str]] = field(default_factory=list)
    base_url: str = ""


def _handler(state: ModelsServer):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            auth = self.headers.get("Authorization", "")
            state.requests.append((self.path, auth))
            if not self.path.endswith("/v1/models"):
                return self._send(404, {"error": {"message": "not found"}})
            if state.required_key and auth != f"Bearer {state.required_key}":
                return self._send(401, {"error": {"message": "bad key", "type": "auth"}})
            data = [
                {"id": m, "object": "model", "created": 0, "owned_by": "t"} for m in state.models
            ]
            return self._send(200, {"object": "list", "data": data})

        def _send(self, status: int, body: dict) -> None:
            raw = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def log_message(self, *args) -> None:
            pass

    return Handler


@pytest.fixture
def models_server() -> Iterator:
    """Start servers with ``models_server(models, required_key="")``; a random path
    prefix keeps each one's cache entries apart."""
    servers: list[ThreadingHTTPServer] = []

    def start(models: list[str], required_key: str = "") -> ModelsServer:
        state = ModelsServer(models=models, required_key=required_key)
        server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(state))
        threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
        servers.append(server)
        state.base_url = f"http://127.0.0.1:{server.server_port}/{pysecrets.token_hex(6)}/v1"
        return state

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def unreachable_base_url() -> str:
    return f"http://127.0.0.1:{free_port()}/{pysecrets.token_hex(6)}/v1"


def custom(name: str, base_url: str, **fields) -> CustomProvider:
    return custom_provider_save(provider=CustomProvider(name=name, base_url=base_url, **fields))


def state(user, name: str):
    return next(s for s in providers_for(user=user) if s.name == name)


# --- Activation --------------------------------------------------------------------------


def test_the_registry_has_the_four_builtin_providers():
    assert [(p.name, p.key_name, p.default_model, p.base_url) for p in BUILTIN_PROVIDERS] == [
        ("openai", "OPENAI_API_KEY", "gpt-5.4", "https://api.openai.com/v1"),
        ("anthropic", "ANTHROPIC_API_KEY", "claude-sonnet-4-6", "https://api.anthropic.com/v1/"),
        ("gemini", "GEMINI_API_KEY", "gemini-3-flash",
         "https://generativelanguage.googleapis.com/v1beta/openai/"),
        ("mistral", "MISTRAL_API_KEY", "mistral-large-latest", "https://api.mistral.ai/v1"),
    ]  # fmt: skip


def test_without_keys_builtin_providers_are_inactive_and_say_how_to_add_one(alice_api):
    body = alice_api.get("/api/providers").json()
    openai = next(p for p in body["providers"] if p["name"] == "openai")
    assert openai == {
        "name": "openai",
        "label": "OpenAI",
        "active": False,
        "reason_if_inactive": openai["reason_if_inactive"],
        "default_model": "gpt-5.4",
        "models": ["gpt-5.4"],
        "vision_models": ["gpt-5.4"],
    }
    assert "OPENAI_API_KEY" in openai["reason_if_inactive"]
    assert "/api/secrets/OPENAI_API_KEY" in openai["reason_if_inactive"]
    assert "default" not in [p["name"] for p in body["providers"]]


def test_a_users_own_key_activates_a_provider_for_that_user_only(alice, bob):
    secret_set(name="OPENAI_API_KEY", value=secret_value("sk"), user=alice)
    assert state(alice, "openai").active
    assert not state(bob, "openai").active


def test_a_global_key_activates_it_for_everyone_and_a_users_own_key_wins(alice, bob):
    shared, own = secret_value("global-key"), secret_value("own-key")
    secret_set(name="MISTRAL_API_KEY", value=shared)
    secret_set(name="MISTRAL_API_KEY", value=own, user=alice)
    alice_choice = provider_resolve(user=alice, llm_provider="mistral")
    bob_choice = provider_resolve(user=bob, llm_provider="mistral")
    assert (alice_choice.api_key, bob_choice.api_key) == (own, shared)
    assert bob_choice.base_url == "https://api.mistral.ai/v1"
    assert bob_choice.model == "mistral-large-latest"
    assert own not in repr(alice_choice), "the key never shows in a repr (logs, tracebacks)"
    assert Secret.objects.get(name="MISTRAL_API_KEY", scope="global").last_used_at is not None


def test_the_servers_process_environment_is_never_consulted(alice, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-the-server-environment")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-the-server-environment")
    assert not state(alice, "openai").active
    assert not state(alice, "anthropic").active


def test_a_keyless_custom_provider_is_active_for_everyone_and_a_disabled_one_is_hidden(alice):
    custom("local", unreachable_base_url(), label="Local model", known_models=["local-model"])
    custom("off", unreachable_base_url(), enabled=False)
    local = state(alice, "local")
    assert local.active and local.label == "Local model" and local.default_model == "local-model"
    assert "off" not in [s.name for s in providers_for(user=alice)]


def test_a_custom_provider_cannot_take_a_builtin_name(db):
    with pytest.raises(InvalidRequest, match="built-in"):
        custom("openai", unreachable_base_url())
    with pytest.raises(InvalidRequest, match="built-in"):
        custom("default", unreachable_base_url())
    with pytest.raises(InvalidRequest, match="built-in"):
        custom("demo", unreachable_base_url())  # the offline demo's name


# --- Model lists -------------------------------------------------------------------------


def test_models_come_from_the_live_list_with_the_users_key_and_are_cached(alice, models_server):
    key = secret_value("local-key")
    server = models_server(["llama3.2", "qwen2.5"], required_key=key)
    custom("ollama", server.base_url, key_secret_name="OLLAMA_KEY", known_models=["fallback"])
    assert not state(alice, "ollama").active
    secret_set(name="OLLAMA_KEY", value=key, user=alice)

    listed = {p.name: p for p in provider_list(user=alice)}["ollama"]
    assert listed.active and listed.models == ["llama3.2", "qwen2.5"]
    [(path, auth)] = server.requests
    assert path.endswith("/v1/models") and auth == f"Bearer {key}"
    provider_list(user=alice)
    assert len(server.requests) == 1, "the second listing comes from the cache"


def test_an_unreachable_provider_falls_back_to_its_known_models(alice):
    custom("vllm", unreachable_base_url(), known_models=["mixtral", "phi-4"], default_model="phi-4")
    listed = {p.name: p for p in provider_list(user=alice)}["vllm"]
    assert listed.active
    assert listed.models == ["mixtral", "phi-4"]
    assert listed.default_model == "phi-4"


def test_a_provider_that_refuses_the_key_falls_back_to_its_known_models(alice, models_server):
    server = models_server(["secret-model"], required_key=secret_value("right"))
    custom("litellm", server.base_url, key_secret_name="LITELLM_KEY", known_models=["known-one"])
    secret_set(name="LITELLM_KEY", value=secret_value("wrong"), user=alice)
    listed = {p.name: p for p in provider_list(user=alice)}["litellm"]
    assert listed.models == ["known-one"]
    assert len(server.requests) == 1


def test_the_providers_api_shows_live_models_and_the_server_default(alice_api, models_server):
    server = models_server(["srv-a", "srv-b"])
    server_key = secret_value("paw-llm-key")
    with override_settings(
        PAW_LLM_BASE_URL=server.base_url, PAW_LLM_API_KEY=server_key, PAW_LLM_MODEL=""
    ):
        body = alice_api.get("/api/providers").json()
    default = body["providers"][0]
    assert default == {
        "name": "default",
        "label": "Server default",
        "active": True,
        "reason_if_inactive": "",
        "default_model": "srv-a",
        "models": ["srv-a", "srv-b"],
        "vision_models": [],
    }
    assert server.requests[0][1] == f"Bearer {server_key}"


# The project's scripted model as the provider: its /v1/models lists its script's models.
SCRIPTED_MODELS = ["scripted-zeta", "scripted-model", "scripted-alpha"]


@pytest.fixture
def scripted_models(scripted_model):
    """The session's scripted model serving a script that declares ``SCRIPTED_MODELS``;
    its cached model lists are forgotten before and after (the worker tests list it as
    their default provider), and the previous script is put back."""

    def forget() -> None:
        for key in ("", SCRIPTED_API_KEY):
            models_cache_forget(base_url=scripted_model.base_url, api_key=key)

    previous = scripted_model.script
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "models": SCRIPTED_MODELS})
    forget()
    yield scripted_model
    forget()
    scripted_model.load(previous)


def test_a_custom_provider_on_the_scripted_model_lists_exactly_its_scripts_models(
    alice_api, scripted_models
):
    custom("scripted", scripted_models.base_url, label="Scripted", known_models=[])
    body = alice_api.get("/api/providers").json()
    listed = next(p for p in body["providers"] if p["name"] == "scripted")
    assert listed["active"] is True
    assert listed["models"] == sorted(SCRIPTED_MODELS)
    assert listed["default_model"] == "scripted-alpha", "the first listed model"


def test_the_server_default_on_the_scripted_model_lists_exactly_its_scripts_models(
    alice_api, scripted_models, settings
):
    settings.PAW_LLM_BASE_URL = scripted_models.base_url
    settings.PAW_LLM_API_KEY = SCRIPTED_API_KEY
    settings.PAW_LLM_MODEL = ""
    body = alice_api.get("/api/providers").json()
    default = body["providers"][0]
    assert (default["name"], default["active"]) == ("default", True)
    assert default["models"] == sorted(SCRIPTED_MODELS)
    assert default["default_model"] == "scripted-alpha"


# --- Choosing a run's provider and model --------------------------------------------------


@pytest.fixture
def two_local_providers(models_server):
    local = models_server(["local-a", "local-b"])
    other = models_server(["other-c", "other-d"])
    custom("local", local.base_url, known_models=["local-a"])
    custom("other", other.base_url, known_models=["other-c"])
    return local, other


def test_precedence_is_run_then_conversation_then_user_then_server_then_first_active(
    alice, models_server, two_local_providers
):
    server = models_server(["srv-model"])
    conversation = Conversation.objects.create(user=alice)

    def choose(**kwargs) -> tuple[str, str]:
        choice = provider_resolve(user=alice, **kwargs)
        return choice.name, choice.model

    assert choose(conversation=conversation) == ("local", "local-a"), "first active"
    with override_settings(PAW_LLM_BASE_URL=server.base_url, PAW_LLM_MODEL="srv-model"):
        assert choose(conversation=conversation) == ("default", "srv-model")
        default = provider_resolve(user=alice)
        assert (default.base_url, default.api_key) == (server.base_url, "")
        provider_default_set(user=alice, llm_provider="other", llm_model="other-d")
        assert choose(conversation=conversation) == ("other", "other-d")
        conversation.llm_provider, conversation.llm_model = "local", "local-b"
        assert choose(conversation=conversation) == ("local", "local-b")
        assert choose(conversation=conversation, llm_model="local-a") == ("local", "local-a")
        # A run naming a provider does not inherit the conversation's model.
        assert choose(conversation=conversation, llm_provider="other") == ("other", "other-c")
        assert choose(conversation=conversation, llm_provider="other", llm_model="other-d") == (
            "other",
            "other-d",
        )


def test_an_inactive_provider_is_refused_with_the_reason(alice):
    with pytest.raises(InvalidRequest) as caught:
        provider_resolve(user=alice, llm_provider="anthropic")
    assert caught.value.code == "provider_inactive"
    assert caught.value.status_code == 400
    assert "ANTHROPIC_API_KEY" in caught.value.detail
    assert "the run's choice" in caught.value.detail


def test_an_inactive_conversation_default_is_refused_too(alice):
    secret_set(name="OPENAI_API_KEY", value=secret_value(), user=alice)
    conversation = Conversation.objects.create(user=alice, llm_provider="gemini")
    with pytest.raises(InvalidRequest, match=r"conversation's default.*GEMINI_API_KEY"):
        provider_resolve(user=alice, conversation=conversation)


def test_an_unknown_model_or_provider_is_refused(alice, two_local_providers):
    with pytest.raises(InvalidRequest) as caught:
        provider_resolve(user=alice, llm_provider="local", llm_model="gpt-99")
    assert caught.value.code == "unknown_model"
    assert "gpt-99" in caught.value.detail and "local-a, local-b" in caught.value.detail
    with pytest.raises(InvalidRequest) as caught:
        provider_resolve(user=alice, llm_provider="nope")
    assert caught.value.code == "unknown_provider"


def test_with_no_active_provider_the_run_is_refused_saying_how_to_add_a_key(alice):
    with pytest.raises(InvalidRequest) as caught:
        provider_resolve(user=alice)
    assert caught.value.code == "no_provider"
    assert "PUT /api/secrets/OPENAI_API_KEY" in caught.value.detail


def test_a_keyless_default_gets_no_key_and_a_global_key_is_reported_by_name(alice):
    secret_set(name="GEMINI_API_KEY", value=secret_value("gem"))
    choice = provider_resolve(user=alice)
    assert (choice.name, choice.model, choice.key_name) == (
        "gemini",
        "gemini-3-flash",
        "GEMINI_API_KEY",
    )
    assert choice.base_url == "https://generativelanguage.googleapis.com/v1beta/openai/"


def test_the_users_default_is_set_validated_and_cleared_through_the_api(
    alice_api, two_local_providers
):
    assert alice_api.get("/api/providers/default").json() == {"llm_provider": "", "llm_model": ""}
    bad = alice_api.put("/api/providers/default", {"llm_provider": "openai"}, format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "provider_inactive"
    bad = alice_api.put(
        "/api/providers/default", {"llm_provider": "local", "llm_model": "zzz"}, format="json"
    )
    assert bad.status_code == 400 and bad.json()["code"] == "unknown_model"
    ok = alice_api.put(
        "/api/providers/default", {"llm_provider": "other", "llm_model": "other-d"}, format="json"
    )
    assert ok.status_code == 200
    assert alice_api.get("/api/providers/default").json() == {
        "llm_provider": "other",
        "llm_model": "other-d",
    }
    cleared = alice_api.put("/api/providers/default", {"llm_provider": ""}, format="json")
    assert cleared.json() == {"llm_provider": "", "llm_model": ""}


def test_saving_a_custom_provider_forgets_the_model_lists_cached_for_its_endpoint(
    alice_api, scripted_models
):
    """A list cached for the endpoint (here by another provider on the same URL, keyless
    like this one) is not what a newly saved provider shows."""
    custom("first", scripted_models.base_url, label="First", known_models=[])
    listed = next(p for p in alice_api.get("/api/providers").json()["providers"] if p["name"] == "first")
    assert listed["models"] == sorted(SCRIPTED_MODELS)
    scripted_models.load({"api_key": SCRIPTED_API_KEY, "models": ["scripted-new"]})
    custom("second", scripted_models.base_url, label="Second", known_models=[])
    providers = alice_api.get("/api/providers").json()["providers"]
    assert next(p for p in providers if p["name"] == "second")["models"] == ["scripted-new"]
