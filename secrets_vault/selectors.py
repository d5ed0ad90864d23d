"""Reads: secrets (never their values, except for the services that hand them out),
datasources, providers and their state for a user."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.conf import settings
from django.db.models import Q, QuerySet

from secrets_vault.fields import UNDECRYPTABLE
from secrets_vault.models import CustomProvider, Datasource, ProviderPreference, Secret
from secrets_vault.providers import (
    BUILTIN_PROVIDERS,
    DEFAULT_PROVIDER_NAME,
    DEMO_MODEL,
    DEMO_PROVIDER_LABEL,
    DEMO_PROVIDER_NAME,
    models_list,
)

if TYPE_CHECKING:
    from accounts.models import User

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"


# --- Secrets ----------------------------------------------------------------------------


def secret_list(*, user: User) -> QuerySet[Secret]:
    """The user's own secrets, by name, without their values."""
    return Secret.objects.filter(scope=Secret.Scope.USER, owner=user).defer("value")


def secret_list_all() -> QuerySet[Secret]:
    """Every secret (global first, then by name), without values: for operators."""
    return Secret.objects.select_related("owner").defer("value")


def secret_get(*, name: str, user: User | None) -> Secret | None:
    """The user's own secret ``name`` (or the global one when ``user`` is None), without
    its value; None when there is none."""
    query = Secret.objects.defer("value")
    if user is None:
        return query.filter(scope=Secret.Scope.GLOBAL, name=name).first()
    return query.filter(scope=Secret.Scope.USER, owner=user, name=name).first()


def secrets_lookup(*, user: User | None, names: list[str] | set[str]) -> dict[str, Secret]:
    """``NAME → Secret`` (values loaded) for each of ``names`` that exists: the user's own
    secret before a global one of the same name. Names not found are absent. A value no
    configured key can decrypt reads as ``fields.UNDECRYPTABLE``."""
    if not names:
        return {}
    owned = Q(scope=Secret.Scope.USER, owner=user) if user is not None else Q(pk__in=[])
    found: dict[str, Secret] = {}
    rows = Secret.objects.filter(Q(name__in=list(names)) & (owned | Q(scope="global")))
    for secret in rows:
        if secret.scope == Secret.Scope.USER or secret.name not in found:
            found[secret.name] = secret
    return found


# --- Datasources ------------------------------------------------------------------------


def datasource_list(*, enabled_only: bool = True) -> QuerySet[Datasource]:
    """Datasources by slug; only enabled ones unless ``enabled_only`` is False."""
    query = Datasource.objects.all()
    return query.filter(enabled=True) if enabled_only else query


# --- Providers --------------------------------------------------------------------------


@dataclass(frozen=True)
class ProviderState:
    """One provider as seen by one user, without its model list.

    ``api_key`` is the resolved key ("" when none is needed or none was found; never
    shown: ``repr`` leaves it out); ``key_name`` the secret (or setting) it came from;
    ``key_secret_id`` that secret's id, to note its use.
    """

    name: str
    label: str
    base_url: str
    key_name: str
    active: bool
    reason_if_inactive: str
    default_model: str
    known_models: tuple[str, ...]
    api_key: str = field(default="", repr=False)
    key_secret_id: int | None = None


@dataclass(frozen=True)
class ProviderInfo:
    """A provider as ``GET /api/providers`` shows it (``models``: live or known list)."""

    name: str
    label: str
    active: bool
    reason_if_inactive: str
    default_model: str
    models: list[str]


def provider_default_configured() -> bool:
    """Whether the operator set the server-wide default (``PAW_LLM_BASE_URL`` or
    ``PAW_LLM_API_KEY``)."""
    return bool(settings.PAW_LLM_BASE_URL or settings.PAW_LLM_API_KEY)


def _key_missing_reason(key_name: str) -> str:
    return (
        f"No {key_name} secret: add yours (the API keys page, /settings/keys/, or PUT "
        f'/api/secrets/{key_name} with {{"value": "..."}}) or ask an operator to add a global '
        "one."
    )


def providers_for(*, user: User) -> list[ProviderState]:
    """Every provider the user could pick, in the order "first active" follows: the
    server-wide default (only when configured), the built-in providers, the enabled
    custom providers by name, then the offline demo (only when ``PAW_DEMO_BASE_URL`` is
    set, so any real provider is preferred to it). A provider is active when it needs no key or its key
    secret resolves (the user's own, then a global one) and decrypts. The server's
    process environment is never consulted."""
    customs = list(CustomProvider.objects.filter(enabled=True))
    key_names = {spec.key_name for spec in BUILTIN_PROVIDERS}
    key_names |= {custom.key_secret_name for custom in customs if custom.key_secret_name}
    secrets = secrets_lookup(user=user, names=key_names)

    def keyed(**kwargs) -> ProviderState:
        key_name = kwargs["key_name"]
        if not key_name:
            return ProviderState(active=True, reason_if_inactive="", **kwargs)
        secret = secrets.get(key_name)
        if secret is None:
            return ProviderState(
                active=False, reason_if_inactive=_key_missing_reason(key_name), **kwargs
            )
        if secret.value is UNDECRYPTABLE or not secret.value:
            return ProviderState(
                active=False,
                reason_if_inactive=f"The {key_name} secret cannot be decrypted with the "
                "server's keys; set it again.",
                **kwargs,
            )
        return ProviderState(
            active=True,
            reason_if_inactive="",
            api_key=secret.value,
            key_secret_id=secret.pk,
            **kwargs,
        )

    states: list[ProviderState] = []
    if provider_default_configured():
        model = settings.PAW_LLM_MODEL
        states.append(
            ProviderState(
                name=DEFAULT_PROVIDER_NAME,
                label="Server default",
                base_url=settings.PAW_LLM_BASE_URL or OPENAI_DEFAULT_BASE_URL,
                key_name="PAW_LLM_API_KEY" if settings.PAW_LLM_API_KEY else "",
                active=True,
                reason_if_inactive="",
                default_model=model,
                known_models=(model,) if model else (),
                api_key=settings.PAW_LLM_API_KEY,
            )
        )
    for spec in BUILTIN_PROVIDERS:
        states.append(
            keyed(
                name=spec.name,
                label=spec.label,
                base_url=spec.base_url,
                key_name=spec.key_name,
                default_model=spec.default_model,
                known_models=spec.known_models,
            )
        )
    for custom in customs:
        known = tuple(custom.known_models)
        states.append(
            keyed(
                name=custom.name,
                label=custom.label or custom.name,
                base_url=custom.base_url,
                key_name=custom.key_secret_name,
                default_model=custom.default_model or (known[0] if known else ""),
                known_models=known,
            )
        )
    if settings.PAW_DEMO_BASE_URL:
        states.append(
            ProviderState(
                name=DEMO_PROVIDER_NAME,
                label=DEMO_PROVIDER_LABEL,
                base_url=settings.PAW_DEMO_BASE_URL,
                key_name="",
                active=True,
                reason_if_inactive="",
                default_model=DEMO_MODEL,
                known_models=(DEMO_MODEL,),
            )
        )
    return states


def provider_models(state: ProviderState) -> list[str]:
    """The provider's models: its live list when it is active (cached; see
    ``providers.models_list``), else its known models."""
    if not state.active:
        return list(state.known_models)
    return models_list(
        base_url=state.base_url, api_key=state.api_key, known_models=list(state.known_models)
    )


def provider_list(*, user: User) -> list[ProviderInfo]:
    """What ``GET /api/providers`` shows the user: each provider with its live model list
    (fetched concurrently, so one slow endpoint costs one timeout, not the sum). A
    provider without a configured default model offers its first listed model."""
    states = providers_for(user=user)
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(states)))) as pool:
        model_lists = list(pool.map(provider_models, states))
    return [
        ProviderInfo(
            name=state.name,
            label=state.label,
            active=state.active,
            reason_if_inactive=state.reason_if_inactive,
            default_model=state.default_model or (models[0] if models else ""),
            models=models,
        )
        for state, models in zip(states, model_lists, strict=True)
    ]


def provider_preference_get(*, user: User) -> ProviderPreference | None:
    """The user's default provider and model, if they chose one."""
    return ProviderPreference.objects.filter(user=user).first()
