"""The authentication backend of the OpenID Connect callback (mozilla-django-oidc's),
configured from the provider's discovery document, checking what the library leaves out.

mozilla-django-oidc does the authorization code flow (state, nonce, PKCE), the token
exchange, and the ID token's signature against the provider's ``jwks_uri``. It does not
check the token's issuer or audience. This backend decodes the ID token with PyJWT
checking the signature, ``iss`` (the discovered issuer), ``aud`` (``PAW_OIDC_CLIENT_ID``;
with several audiences ``azp`` must be it too), ``exp`` and ``iat`` (with
:data:`CLOCK_LEEWAY_SECONDS`), as OpenID Connect Core 1.0 §3.1.3.7 requires, and hands
the claims to :func:`sso.services.sso_sign_in`. A refusal raises
:class:`sso.services.SignOnRefused` out of ``authenticate()``, for the callback view
to show.
"""

from __future__ import annotations

import logging
from typing import Any

import jwt
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from accounts.services import sso_enabled
from sso.provider import client_secret, provider_configuration
from sso.services import SignOnRefused, sso_sign_in

logger = logging.getLogger(__name__)

#: Seconds of clock difference with the provider tolerated on ``exp`` and ``iat``.
CLOCK_LEEWAY_SECONDS = 60


class OidcBackend(OIDCAuthenticationBackend):
    """Authenticates the callback of a sign-in at the provider (``authenticate`` given a
    ``nonce``); every other ``authenticate()`` call (a password) is not its business."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Not the library's __init__: it reads the endpoints at once, and Django builds a
        # backend for every authenticate() call, password sign-ins included.
        self.UserModel = get_user_model()
        self.OIDC_RP_CLIENT_ID = settings.PAW_OIDC_CLIENT_ID
        self.OIDC_RP_SIGN_ALGO = settings.PAW_OIDC_SIGN_ALGO
        self.OIDC_RP_IDP_SIGN_KEY = None

    # The library reads these attributes (its names); they come from discovery and the
    # vault, when used.
    @property
    def OIDC_OP_TOKEN_ENDPOINT(self) -> str:
        return provider_configuration()["token_endpoint"]

    @property
    def OIDC_OP_USER_ENDPOINT(self) -> str:
        return provider_configuration()["userinfo_endpoint"]

    @property
    def OIDC_OP_JWKS_ENDPOINT(self) -> str:
        return provider_configuration()["jwks_uri"]

    @property
    def OIDC_RP_CLIENT_SECRET(self) -> str:
        return client_secret()

    def authenticate(self, request: Any, **kwargs: Any) -> Any:
        if request is None or "nonce" not in kwargs or not sso_enabled():
            return None
        return super().authenticate(request, **kwargs)

    def get_user(self, user_id: Any) -> Any:
        # Django's rule (inactive users have no session), which the library's lacks.
        return ModelBackend.get_user(self, user_id)

    def _verify_jws(self, payload: str, key: Any) -> dict[str, Any]:
        """The claims of the signed JWT ``payload`` (an ID token, or a signed userinfo
        answer), checked as the module says; :class:`SignOnRefused` (``token_invalid``)
        otherwise."""
        try:
            alg = jwt.get_unverified_header(payload).get("alg")
        except jwt.PyJWTError as error:
            raise _token_refused(f"it is not a JWT ({error})") from error
        if alg != self.OIDC_RP_SIGN_ALGO:
            raise _token_refused(f"it is signed with {alg!r}, not {self.OIDC_RP_SIGN_ALGO}")
        try:
            claims = jwt.decode(
                payload,
                key,
                algorithms=[alg],
                audience=self.OIDC_RP_CLIENT_ID,
                issuer=provider_configuration()["issuer"],
                leeway=CLOCK_LEEWAY_SECONDS,
                options={"require": ["iss", "sub", "aud", "exp", "iat"]},
            )
        except jwt.ExpiredSignatureError as error:
            raise _token_refused("it has expired") from error
        except jwt.InvalidAudienceError as error:
            raise _token_refused("it was issued for another application (audience)") from error
        except jwt.InvalidIssuerError as error:
            raise _token_refused("it was issued by another provider (issuer)") from error
        except jwt.PyJWTError as error:
            raise _token_refused(str(error)) from error
        audience = claims["aud"]
        if (
            isinstance(audience, list)
            and len(audience) > 1
            and claims.get("azp") != self.OIDC_RP_CLIENT_ID
        ):
            raise _token_refused("it names several audiences but not PAW as its authorized party")
        return claims

    def get_or_create_user(self, access_token: str, id_token: str, payload: dict) -> Any:
        userinfo = self.get_userinfo(access_token, id_token, payload)
        # OpenID Connect Core 1.0 §5.3.2: a userinfo answer for another subject is not used.
        if userinfo.get("sub") != payload["sub"]:
            raise _token_refused("the provider's userinfo is about another subject")
        return sso_sign_in(issuer=payload["iss"], claims={**payload, **userinfo})


def _token_refused(why: str) -> SignOnRefused:
    logger.warning("single sign-on refused an ID token: %s", why)
    return SignOnRefused(
        f"The sign-in service's identity token was refused: {why}.", code="token_invalid"
    )
