"""JWTs that carry the user's ``token_version``.

Every refresh token (and so every access token made from it, which copies its claims)
carries ``token_version``; :mod:`accounts.authentication` and the refresh service reject a
token whose claim differs from the user's current value. Bumping the value (logout,
password change) therefore revokes every earlier token of that user at once.
"""

from __future__ import annotations

from rest_framework_simplejwt.tokens import RefreshToken

from accounts.models import User

TOKEN_VERSION_CLAIM = "token_version"  # noqa: S105 - a claim name, not a secret


class PawRefreshToken(RefreshToken):
    """simplejwt's refresh token (blacklist-aware) plus the ``token_version`` claim."""

    @classmethod
    def for_user(cls, user: User) -> PawRefreshToken:
        token = super().for_user(user)
        token[TOKEN_VERSION_CLAIM] = user.token_version
        return token
