"""Choosing the model provider and model of a run; each user's default choice."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from django.db import transaction

from paw_project.errors import InvalidRequest
from secrets_vault.masking import secret_values_register
from secrets_vault.models import CustomProvider, ProviderAccess, ProviderPreference
from secrets_vault.providers import DEFAULT_PROVIDER_NAME, models_cache_reset
from secrets_vault.selectors import (
    ProviderState,
    provider_grants,
    provider_models,
    provider_preference_get,
    providers_for,
)
from secrets_vault.services.secrets import model_validate, secrets_mark_used

if TYPE_CHECKING:
    from accounts.models import User
    from conversations.models import Conversation

NO_PROVIDER_MESSAGE = (
    "No model provider is available to you. Add an API key as one of your secrets (the API "
    'keys page, /settings/keys/, or PUT /api/secrets/OPENAI_API_KEY with {"value": "sk-..."}; '
    "or ANTHROPIC_API_KEY, "
    "GEMINI_API_KEY, MISTRAL_API_KEY), or ask an operator to add a global key or a "
    "provider."
)


@dataclass(frozen=True)
class ProviderChoice:
    """The provider and model a run uses: what the sandbox gets as ``OPENAI_BASE_URL``
    (``base_url``), ``OPENAI_API_KEY`` (``api_key``; "" for an endpoint that needs no
    key: pass any non-empty placeholder, the ``openai`` SDK refuses an empty key) and
    ``OPENAI_MODEL`` (``model``). ``name`` is what ``Run.provider`` stores, ``label`` the
    human name. ``key_name`` names the secret (or ``PAW_LLM_API_KEY``) the key came from,
    for masking as ``[secret:KEY_NAME]``. ``vision``: the model accepts images (image
    content parts). ``repr`` never shows the key."""

    name: str
    label: str
    base_url: str
    api_key: str = field(repr=False)
    model: str
    key_name: str = ""
    vision: bool = False


def provider_resolve(
    *,
    user: User,
    conversation: Conversation | None = None,
    llm_provider: str | None = None,
    llm_model: str | None = None,
) -> ProviderChoice:
    """The provider and model for a run of ``user``.

    Precedence: the run's ``llm_provider`` / ``llm_model`` > the conversation's default
    (``conversation.llm_provider`` / ``llm_model``) > the user's default
    (``ProviderPreference``) > the server-wide default (provider ``default``, from
    ``PAW_LLM_BASE_URL`` / ``PAW_LLM_API_KEY`` / ``PAW_LLM_MODEL``, when configured) > the
    first active provider (built-ins in registry order, then custom ones by name).
    The first level naming a provider picks it; the model is the first one named at that
    level or above, else the provider's default model (else its first listed model).

    Who may use what (:func:`~secrets_vault.selectors.provider_grants`): a provider the
    user may not use is ``provider_not_allowed``, a model outside their teams' models
    ``model_not_allowed`` (both naming it) when the run (or the caller) chose it; a stored
    default (the conversation's, the user's) naming one is passed over instead (the next
    level decides; a model outside their models leaves the provider's default model), so
    a change of teams never stops a conversation. The automatic choice is among the
    providers the user may use only.

    Raises :class:`InvalidRequest` (400) with the reason and where the choice came from:
    ``provider_not_allowed``, ``model_not_allowed``,
    ``unknown_provider``, ``provider_inactive`` (e.g. no key secret), ``unknown_model``
    (a named model the provider does not list; its live ``/models`` list, or its known
    models when that is unreachable), ``no_model``, and ``no_provider`` when nothing is
    active, telling the user how to add a key. Notes the key secret as used.
    """
    choice, state = _choose(
        user=user, conversation=conversation, llm_provider=llm_provider, llm_model=llm_model
    )
    if state.key_secret_id is not None:
        secrets_mark_used(secret_ids=[state.key_secret_id])
    if choice.api_key:
        secret_values_register({choice.key_name: choice.api_key})
    return choice


def _choose(
    *,
    user: User,
    conversation: Conversation | None,
    llm_provider: str | None,
    llm_model: str | None,
    where: str = "the run's choice",
) -> tuple[ProviderChoice, ProviderState]:
    preference = provider_preference_get(user=user)
    levels = [(where, llm_provider, llm_model, True)]
    if conversation is not None:
        levels.append(
            ("the conversation's default", conversation.llm_provider, conversation.llm_model, False)
        )
    if preference is not None:
        levels.append(("your default", preference.llm_provider, preference.llm_model, False))

    grants = provider_grants(user=user)
    states = providers_for(user=user, grants=grants)
    by_name = {state.name: state for state in states}
    wanted_model, model_source = "", ""
    name, source = "", ""
    for where, provider, model, chosen in levels:
        provider, model = (provider or "").strip(), (model or "").strip()
        if not chosen:
            # A stored default is passed over when it names a provider the user may no
            # longer use (their teams changed), and its model when outside their models.
            if provider and provider not in by_name and not grants.allows(provider):
                continue
            state = by_name.get(provider or name)
            if model and state is not None and not state.allows_model(model):
                model = ""
        if model and not wanted_model:
            wanted_model, model_source = model, where
        if provider:
            name, source = provider, where
            break

    if not name:
        active = [state for state in states if state.active]
        if not active:
            raise InvalidRequest(NO_PROVIDER_MESSAGE, code="no_provider")
        name = active[0].name
        source = (
            "the server default" if name == DEFAULT_PROVIDER_NAME else "the first active provider"
        )

    state = by_name.get(name)
    if state is None and not grants.allows(name):
        raise InvalidRequest(
            f"Provider '{name}' ({source}) is not available to you: an operator limited it to "
            "some teams. Choose another provider, or use your own key for it (the API keys "
            "page) if it takes one.",
            code="provider_not_allowed",
        )
    if state is None:
        known = ", ".join(by_name)
        raise InvalidRequest(
            f"Unknown provider '{name}' ({source}). Known providers: {known}.",
            code="unknown_provider",
        )
    if not state.active:
        raise InvalidRequest(
            f"Provider '{name}' ({source}) is not active: {state.reason_if_inactive}",
            code="provider_inactive",
        )

    model = wanted_model or state.default_model
    if wanted_model and not state.allows_model(wanted_model):
        raise InvalidRequest(
            f"Model '{wanted_model}' of provider '{name}' ({model_source}) is not available to "
            f"you: your teams may use only {', '.join(state.allowed_models or ())}.",
            code="model_not_allowed",
        )
    if wanted_model and wanted_model != state.default_model:
        models = provider_models(state)
        if wanted_model not in models:
            shown = ", ".join(models[:20]) + (" ..." if len(models) > 20 else "")
            raise InvalidRequest(
                f"Provider '{name}' has no model '{wanted_model}' ({model_source}). "
                f"Its models: {shown or 'none listed'}.",
                code="unknown_model",
            )
    if not model:
        models = provider_models(state)
        if not models:
            raise InvalidRequest(
                f"Provider '{name}' has no default model and lists none: name a model "
                "(llm_model), or ask an operator to set one.",
                code="no_model",
            )
        model = models[0]
    choice = ProviderChoice(
        name=state.name,
        label=state.label,
        base_url=state.base_url,
        api_key=state.api_key,
        model=model,
        key_name=state.key_name,
        vision=state.accepts_images(model),
    )
    return choice, state


def provider_choice_check(
    *, user: User, llm_provider: str, llm_model: str = "", where: str = "the run's choice"
) -> None:
    """Check a provider/model choice before it is stored (a user's or a conversation's
    default): an empty ``llm_provider`` (no choice) passes; a model without a provider is
    :class:`InvalidRequest` ``provider_required``; otherwise as :func:`provider_resolve`
    would judge it (``unknown_provider``, ``provider_inactive``, ``unknown_model``), the
    message naming ``where`` the choice came from."""
    llm_provider, llm_model = llm_provider.strip(), llm_model.strip()
    if llm_model and not llm_provider:
        raise InvalidRequest(
            f"Choose a provider for the model ({where}).", code="provider_required"
        )
    if llm_provider:
        _choose(
            user=user, conversation=None, llm_provider=llm_provider, llm_model=llm_model,
            where=where,
        )  # fmt: skip


def provider_default_set(
    *, user: User, llm_provider: str, llm_model: str = ""
) -> ProviderPreference:
    """Set (or, with an empty ``llm_provider``, clear) the user's default provider and
    model, validated like a run's override: :class:`InvalidRequest` for an unknown or
    inactive provider or an unknown model, or a model without a provider."""
    llm_provider, llm_model = llm_provider.strip(), llm_model.strip()
    provider_choice_check(
        user=user, llm_provider=llm_provider, llm_model=llm_model, where="your default"
    )
    with transaction.atomic():
        preference, _ = ProviderPreference.objects.select_for_update().get_or_create(user=user)
        preference.llm_provider, preference.llm_model = llm_provider, llm_model
        preference.save()
    return preference


def custom_provider_save(*, provider: CustomProvider) -> CustomProvider:
    """Validate and save a custom provider (name not a built-in one, known models a list
    of names, default model among them), and forget the cached model lists, so the
    provider's list is read afresh. A renamed provider keeps its access rule
    (:class:`~secrets_vault.models.ProviderAccess`) unless its new name has one.
    :class:`InvalidRequest` when invalid."""
    model_validate(provider)
    with transaction.atomic():
        before = (
            CustomProvider.objects.filter(pk=provider.pk).values_list("name", flat=True).first()
            if provider.pk
            else None
        )
        provider.save()
        renamed = before and before != provider.name
        if renamed and not ProviderAccess.objects.filter(provider=provider.name).exists():
            ProviderAccess.objects.filter(provider=before).update(provider=provider.name)
    models_cache_reset()
    transaction.on_commit(models_cache_reset)  # again: a list read meanwhile saw the old row
    return provider
