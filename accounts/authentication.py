"""API authentication: JWT bearer tokens checked against the user's ``token_version``."""

from __future__ import annotations

from rest_framework_simplejwt.authentication import JWTAuthentication
from rest_framework_simplejwt.exceptions import AuthenticationFailed
from rest_framework_simplejwt.tokens import Token

from accounts.models import User
from accounts.tokens import TOKEN_VERSION_CLAIM


class PawJWTAuthentication(JWTAuthentication):
    """``Authorization: Bearer <access token>``, as simplejwt checks it (signature, expiry,
    type, active user), plus: the token's ``token_version`` claim must equal the user's
    current one, so tokens issued before a logout or password change fail at once (401,
    code ``token_revoked``). Costs the one user query simplejwt already makes."""

    def get_user(self, validated_token: Token) -> User:
        user = super().get_user(validated_token)
        if validated_token.get(TOKEN_VERSION_CLAIM) != user.token_version:
            raise AuthenticationFailed(
                "The token was revoked (logout or password change).", code="token_revoked"
            )
        return user
