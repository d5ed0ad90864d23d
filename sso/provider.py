"""The OpenID Connect provider PAW signs people in with: its discovery document and
PAW's client secret.

The endpoints come from the provider's discovery document,
``<PAW_OIDC_ISSUER>/.well-known/openid-configuration`` (OpenID Connect Discovery 1.0
§4), read when first needed and kept in the shared cache for
:data:`DISCOVERY_CACHE_SECONDS`; its ``issuer`` must be exactly the configured one (§4.3),
which is also the ``iss`` every ID token must carry.
"""

from __future__ import annotations

import hashlib
import logging
from typing import Any

import requests
from django.conf import settings
from django.core.cache import cache

from secrets_vault.masking import secret_values_register
from secrets_vault.placeholders import placeholder_whole
from secrets_vault.services import placeholders_resolve

logger = logging.getLogger(__name__)

#: Seconds the discovery document is kept (providers rotate endpoints rarely; their keys
#: are read from ``jwks_uri`` at every sign-in).
DISCOVERY_CACHE_SECONDS = 3600
#: What PAW needs from the discovery document.
REQUIRED_ENDPOINTS = ("authorization_endpoint", "token_endpoint", "userinfo_endpoint", "jwks_uri")


class ProviderUnavailable(Exception):
    """The provider's discovery document cannot be read or is unusable (the message says
    why, for the log; it never holds a secret)."""


def provider_configuration() -> dict[str, Any]:
    """The provider's discovery document (a dict with at least :data:`REQUIRED_ENDPOINTS`
    and ``issuer``), from the cache or fetched (``PAW_OIDC_TIMEOUT`` seconds at most).

    Raises :class:`ProviderUnavailable` when it cannot be fetched or parsed, names another
    issuer, or lacks an endpoint. Failures are not cached: the next sign-in tries again.
    """
    issuer = settings.PAW_OIDC_ISSUER
    key = f"sso:discovery:{hashlib.sha256(issuer.encode()).hexdigest()[:32]}"
    config = cache.get(key)
    if config is not None:
        return config
    url = f"{issuer.rstrip('/')}/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=settings.PAW_OIDC_TIMEOUT)
        response.raise_for_status()
        config = response.json()
    except (requests.RequestException, ValueError) as error:
        raise ProviderUnavailable(f"cannot read {url}: {error}") from error
    if not isinstance(config, dict):
        raise ProviderUnavailable(f"{url} is not a JSON object")
    if config.get("issuer") != issuer:
        raise ProviderUnavailable(
            f"{url} names the issuer {config.get('issuer')!r}: set PAW_OIDC_ISSUER to exactly that"
        )
    missing = [name for name in REQUIRED_ENDPOINTS if not isinstance(config.get(name), str)]
    if missing:
        raise ProviderUnavailable(f"{url} has no {', '.join(missing)}")
    cache.set(key, config, DISCOVERY_CACHE_SECONDS)
    return config


def client_secret() -> str:
    """PAW's client secret at the provider: ``PAW_OIDC_CLIENT_SECRET`` as it is, or, when
    it is a ``{secret:NAME}`` placeholder, the vault's global secret ``NAME`` (read now, so
    a changed secret needs no restart). The value is registered for log masking.

    Raises ``paw_project.errors.InvalidRequest`` (``secret_missing``,
    ``secret_undecryptable``) when the named secret cannot be had."""
    value = settings.PAW_OIDC_CLIENT_SECRET
    if placeholder_whole(value) is None:
        secret_values_register({"PAW_OIDC_CLIENT_SECRET": value})
        return value
    return placeholders_resolve(user=None, obj=value).value
