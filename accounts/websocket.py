"""Websocket authentication with a token, for integrations.

The browser's socket is authenticated by its session cookie (Channels'
``AuthMiddlewareStack``). An integration passes a JWT access token or a personal API token
(``paw_…``) either as the query parameter ``?token=<token>`` or as a subprotocol:
``Sec-WebSocket-Protocol: paw, <token>`` (the server then answers with the subprotocol
``paw``). A token, when given, decides: an invalid, expired or revoked one leaves the
socket anonymous, and it is closed with 4401.
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

from accounts.services import PERSONAL_TOKEN_PREFIX, personal_token_authenticate

SUBPROTOCOL = "paw"


def user_for_token(raw: str) -> tuple[Any, int | None]:
    """``(user, personal token id)`` for a valid personal API token, ``(user, None)`` for a
    valid JWT access token, ``(None, None)`` for anything else."""
    if raw.startswith(PERSONAL_TOKEN_PREFIX):
        found = personal_token_authenticate(raw=raw)
        return (found[0], found[1].pk) if found else (None, None)
    return user_for_access_token(raw), None


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
            user, token_id = await database_sync_to_async(user_for_token)(token)
            scope["user"] = user or AnonymousUser()
            scope["paw_auth"] = "jwt"  # a bearer token: revoking the user's tokens closes it
            scope["paw_token_id"] = token_id  # deleting this personal token closes it too
        return await super().__call__(scope, receive, send)
