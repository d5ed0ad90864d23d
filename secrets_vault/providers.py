"""The built-in model providers and live model listing.

Every provider is an OpenAI-compatible endpoint: the sandbox gets ``OPENAI_BASE_URL``,
``OPENAI_API_KEY`` and ``OPENAI_MODEL`` for the chosen one. Base URLs and key names are
the providers' documented OpenAI-compatible endpoints:

* OpenAI: https://platform.openai.com/docs/api-reference
* Anthropic: https://docs.anthropic.com/en/api/openai-sdk
* Google Gemini: https://ai.google.dev/gemini-api/docs/openai
* Mistral: https://docs.mistral.ai/api/

Which models accept images (``vision``: image content parts in chat messages, see
``conversations/services/attachments.py``) is a catalogue of name patterns per built-in
provider (:attr:`ProviderSpec.vision_models`, from the providers' model pages), a flag per
custom provider (``CustomProvider.vision``) and ``PAW_LLM_VISION`` for the server default;
:func:`model_accepts_images` applies them.

Model lists come from the endpoint's ``GET /models`` through the official ``openai`` SDK,
cached in the Django cache (``PAW_PROVIDER_MODELS_CACHE_SECONDS``), with a short timeout
(``PAW_PROVIDER_MODELS_TIMEOUT``) and the provider's known models as the fallback.
"""

from __future__ import annotations

import fnmatch
import hashlib
import logging
from dataclasses import dataclass

from django.conf import settings
from django.core.cache import cache

from paw_project.demo import DEMO_PROVIDER_NAME  # the offline demo's name (re-exported)

logger = logging.getLogger(__name__)

#: The name under which the server-wide default (``PAW_LLM_*``) is shown.
DEFAULT_PROVIDER_NAME = "default"
DEMO_PROVIDER_LABEL = "Scripted demo (no AI)"
DEMO_MODEL = "scripted-demo"


@dataclass(frozen=True)
class ProviderSpec:
    """A built-in provider: ``key_name`` is the secret holding its API key;
    ``vision_models`` the ``fnmatch`` patterns (case-insensitive) of its model names that
    accept images (every one of ``known_models`` is flagged by it or not)."""

    name: str
    label: str
    base_url: str
    key_name: str
    default_model: str
    known_models: tuple[str, ...]
    vision_models: tuple[str, ...] = ()


BUILTIN_PROVIDERS: tuple[ProviderSpec, ...] = (
    ProviderSpec(
        "openai",
        "OpenAI",
        "https://api.openai.com/v1",
        "OPENAI_API_KEY",
        "gpt-5.4",
        ("gpt-5.4",),
        # https://platform.openai.com/docs/guides/images-vision
        (
            "gpt-4o*",
            "chatgpt-4o*",
            "gpt-4-turbo*",
            "gpt-4.1*",
            "gpt-4.5*",
            "gpt-5*",
            "o1",
            "o1-2*",
            "o3",
            "o3-2*",
            "o3-pro*",
            "o4-mini*",
        ),
    ),
    ProviderSpec(
        "anthropic",
        "Anthropic",
        "https://api.anthropic.com/v1/",
        "ANTHROPIC_API_KEY",
        "claude-sonnet-4-6",
        ("claude-sonnet-4-6",),
        # https://docs.anthropic.com/en/docs/build-with-claude/vision: every Claude 3 and later
        ("claude-3*", "claude-sonnet-*", "claude-opus-*", "claude-haiku-*"),
    ),
    ProviderSpec(
        "gemini",
        "Google Gemini",
        "https://generativelanguage.googleapis.com/v1beta/openai/",
        "GEMINI_API_KEY",
        "gemini-3-flash",
        ("gemini-3-flash",),
        # https://ai.google.dev/gemini-api/docs/image-understanding (not the embedding models)
        ("gemini-1.5*", "gemini-2*", "gemini-3*"),
    ),
    ProviderSpec(
        "mistral",
        "Mistral",
        "https://api.mistral.ai/v1",
        "MISTRAL_API_KEY",
        "mistral-large-latest",
        ("mistral-large-latest",),
        # https://docs.mistral.ai/capabilities/vision/
        (
            "mistral-large-latest",
            "mistral-large-2512*",
            "mistral-medium*",
            "mistral-small-latest",
            "mistral-small-2503*",
            "mistral-small-2506*",
            "pixtral-*",
        ),
    ),
)

#: Names a custom provider may not take.
RESERVED_PROVIDER_NAMES = frozenset(
    {DEFAULT_PROVIDER_NAME, DEMO_PROVIDER_NAME, *(p.name for p in BUILTIN_PROVIDERS)}
)

#: ``vision_models`` meaning "every model of the provider accepts images".
ALL_MODELS = ("*",)

_CACHE_PREFIX = "secrets_vault:models:"


def model_accepts_images(vision_models: tuple[str, ...] | list[str], model: str) -> bool:
    """Whether ``model`` matches one of the ``fnmatch`` patterns ``vision_models``
    (compared without regard to case or surrounding space): whether PAW may send it image
    content parts."""
    name = (model or "").strip().lower()
    return bool(name) and any(
        fnmatch.fnmatchcase(name, pattern.strip().lower()) for pattern in vision_models
    )


#: A number in every model list's cache key; raising it forgets every cached list.
_GENERATION_KEY = _CACHE_PREFIX + "generation"


def _cache_key(base_url: str, api_key: str) -> str:
    # The key only selects the entry (lists can differ per account); it is never stored.
    digest = hashlib.sha256(f"{base_url}\0{api_key}".encode()).hexdigest()[:32]
    return f"{_CACHE_PREFIX}{cache.get(_GENERATION_KEY, 0)}:{digest}"


def models_cache_reset() -> None:
    """Forget every cached model list (a provider was added or changed: the lists cached
    for its endpoint, under any user's key, may be another provider's or out of date).
    Each endpoint is asked again on its next :func:`models_list`."""
    try:
        cache.incr(_GENERATION_KEY)
    except ValueError:  # not set yet (or evicted)
        cache.set(_GENERATION_KEY, 1, None)


def models_cache_forget(*, base_url: str, api_key: str) -> None:
    """Drop the cached model list of an endpoint (the next :func:`models_list` asks it)."""
    cache.delete(_cache_key(base_url, api_key))


def models_list(*, base_url: str, api_key: str, known_models: list[str]) -> list[str]:
    """The model ids the endpoint at ``base_url`` lists (``GET {base_url}/models``), sorted.

    Cached for ``PAW_PROVIDER_MODELS_CACHE_SECONDS`` seconds per (base URL, key). When the
    endpoint cannot be read within ``PAW_PROVIDER_MODELS_TIMEOUT`` seconds, refuses the
    key, or lists nothing, ``known_models`` is returned (and remembered for a tenth of the
    cache time, so an unreachable endpoint does not slow every request). Never raises for
    a provider failure; the failure is logged without the key.
    """
    key = _cache_key(base_url, api_key)
    cached = cache.get(key)
    if cached is not None:
        return list(cached)
    ttl = settings.PAW_PROVIDER_MODELS_CACHE_SECONDS
    try:
        found = _models_fetch(base_url=base_url, api_key=api_key)
    except Exception as exc:  # any failure means "use the known list"
        logger.warning(
            "could not list the models of %s (%s); using the known list",
            base_url,
            type(exc).__name__,
        )
        found = []
    if found:
        cache.set(key, found, ttl)
        return found
    fallback = list(known_models)
    cache.set(key, fallback, max(1, ttl // 10))
    return fallback


def _models_fetch(*, base_url: str, api_key: str) -> list[str]:
    from openai import OpenAI  # heavy import, only when a list is really fetched

    client = OpenAI(
        base_url=base_url,
        # The SDK refuses an empty key; a keyless endpoint ignores whatever is sent.
        api_key=api_key or "no-key",
        timeout=settings.PAW_PROVIDER_MODELS_TIMEOUT,
        max_retries=0,
    )
    try:
        return sorted({model.id for model in client.models.list() if model.id})
    finally:
        client.close()
