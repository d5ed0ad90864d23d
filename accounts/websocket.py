"""Websocket authentication with a token, for integrations.

The browser's socket is authenticated by its session cookie (Channels'
``AuthMiddlewareStack``). An integration passes a JWT access token or a personal API token
(``paw_…``) either as the query parameter ``?token=<token>`` or as a subprotocol:
``Sec-WebSocket-Protocol: paw, <token>`` (the server then answers with the subprotocol
``paw``). A token, when given, decides: an invalid, expired or revoked one leaves the
socket anonymous, and it is closed with 4401.

A token that fails counts as a failed bearer authentication of the client's address, as
on the API (``accounts.services.bearer_failure_record``): past ``PAW_THROTTLE_BAD_TOKENS``
the socket of a failed token gets ``error`` ``throttled`` (with ``retry_after``,
seconds) and is closed with 4429 instead of 4401; a valid token is always accepted.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from channels.middleware import BaseMiddleware
from django.contrib.auth.models import AnonymousUser
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.settings import api_settings
from rest_framework_simplejwt.authentication import JWTAuthentication
from rest_framework_simplejwt.exceptions import InvalidToken, TokenError

from accounts.services import (
    PERSONAL_TOKEN_PREFIX,
    bearer_failure_record,
    personal_token_authenticate,
)
from paw_project.throttles import client_address

SUBPROTOCOL = "paw"


def user_for_token(raw: str, *, address: str) -> tuple[Any, int | None, int | None]:
    """``(user, personal token id, None)`` for a valid personal API token, ``(user, None,
    None)`` for a valid JWT access token, ``(None, None, None)`` for anything else, which
    counts as a failed bearer authentication of the client ``address``; ``(None, None,
    seconds)`` when that failure is past ``PAW_THROTTLE_BAD_TOKENS``: the seconds until
    the address's failures are within it again."""
    personal = raw.startswith(PERSONAL_TOKEN_PREFIX)
    if personal:
        found = personal_token_authenticate(raw=raw)
        if found:
            return found[0], found[1].pk, None
    else:
        user = user_for_access_token(raw)
        if user is not None:
            return user, None, None
    wait = bearer_failure_record(address=address, kind="personal" if personal else "jwt")
    return None, None, wait


def scope_address(scope: dict[str, Any]) -> str:
    """The client address of a websocket ``scope``, decided as for an HTTP request
    (``paw_project.throttles.client_address``)."""
    meta = {"REMOTE_ADDR": (scope.get("client") or ("",))[0] or ""}
    for name, value in scope.get("headers", ()):
        if name == b"x-forwarded-for":
            meta["HTTP_X_FORWARDED_FOR"] = value.decode("latin-1")
    return client_address(meta)


def user_for_access_token(raw: str) -> Any:
    """The user of a valid access token (checked by the API's own JWT authentication
    class, revocation included), else ``None``."""
    for auth_class in api_settings.DEFAULT_AUTHENTICATION_CLASSES:
        if isinstance(auth_class, type) and issubclass(auth_class, JWTAuthentication):
            authenticator = auth_class()
            try:
                return authenticator.get_user(authenticator.get_validated_token(raw.encode()))
            except (InvalidToken, TokenError, AuthenticationFailed):
                return None
    return None


def _token_from(scope: dict[str, Any]) -> tuple[str | None, str | None]:
    """``(token, subprotocol to accept)`` from the query string or the subprotocols."""
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    if query.get("token"):
        return query["token"][0], None
    subprotocols = list(scope.get("subprotocols") or [])
    if SUBPROTOCOL in subprotocols:
        others = [p for p in subprotocols if p != SUBPROTOCOL]
        if others:
            return others[0], SUBPROTOCOL
        return None, SUBPROTOCOL
    return None, None


class JwtAuthMiddleware(BaseMiddleware):
    """Sets ``scope["user"]`` from a token when the client sent one (see the module doc)."""

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        token, subprotocol = _token_from(scope)
        scope = dict(scope, paw_subprotocol=subprotocol)
        if token is not None:
            user, token_id, wait = await database_sync_to_async(user_for_token)(
                token, address=scope_address(scope)
            )
            scope["user"] = user or AnonymousUser()
            scope["paw_auth_retry_after"] = wait  # seconds: closed with 4429
            scope["paw_auth"] = "jwt"  # a bearer token: revoking the user's tokens closes it
            scope["paw_token_id"] = token_id  # deleting this personal token closes it too
        return await super().__call__(scope, receive, send)
