"""API authentication: personal API tokens (``paw_…``) and JWT bearer tokens, both checked
against the user's ``token_version``.

Failed bearer authentications are limited per client address (``PAW_THROTTLE_BAD_TOKENS``,
``accounts.services.bearer_lockout_wait``): past the limit a bearer token from that
address is answered ``429 {"detail", "code": "throttled"}`` with ``Retry-After`` without
being checked, a valid one too, until the oldest counted failure leaves the window.
"""

from __future__ import annotations

from django.utils.translation import gettext_lazy as _
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import Throttled
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle
from rest_framework_simplejwt.authentication import JWTAuthentication
from rest_framework_simplejwt.exceptions import AuthenticationFailed, InvalidToken
from rest_framework_simplejwt.settings import api_settings
from rest_framework_simplejwt.tokens import Token
from rest_framework_simplejwt.utils import get_md5_hash_password

from accounts.models import PersonalToken, User
from accounts.services import (
    PERSONAL_TOKEN_PREFIX,
    bearer_failure_record,
    bearer_lockout_wait,
    personal_token_authenticate,
)
from accounts.tokens import TOKEN_VERSION_CLAIM


class BearerThrottled(Throttled):
    """429 ``throttled`` (with ``Retry-After``): too many failed bearer authentications
    from the client's address."""

    default_detail = "Too many failed token authentications from this address."


def _address(request: Request) -> str:
    """The client address the bearer failures are counted by (as the other throttles
    count: ``REMOTE_ADDR``, or ``X-Forwarded-For`` as far as ``PAW_NUM_PROXIES`` trusts
    it)."""
    return BaseThrottle().get_ident(request)


def _refuse_if_locked_out(address: str) -> None:
    wait = bearer_lockout_wait(address=address)
    if wait is not None:
        raise BearerThrottled(wait)


class PersonalTokenAuthentication(BaseAuthentication):
    """``Authorization: Bearer paw_…``: a personal API token (``accounts.models.PersonalToken``).

    A bearer value that does not start with ``paw_`` is left to the next class (the JWT
    one); a ``paw_`` value that is unknown, expired or revoked is a 401
    (``token_not_valid``), never passed on. ``request.auth`` is the token. Listed first in
    ``DEFAULT_AUTHENTICATION_CLASSES``, so every endpoint accepts it and its throttles
    count the token's user like any other. A failure counts against the client's
    address (see the module docstring): 429 instead of 401 past the limit."""

    keyword = b"bearer"
    #: Failures count per client address (``PAW_THROTTLE_BAD_TOKENS``): any view using this
    #: class can answer 429 (``paw_project.schema`` documents it).
    bearer_failures_counted = True

    def authenticate(self, request: Request) -> tuple[User, PersonalToken] | None:
        parts = get_authorization_header(request).split()
        if len(parts) != 2 or parts[0].lower() != self.keyword:
            return None
        try:
            raw = parts[1].decode("ascii")
        except UnicodeDecodeError:
            return None
        if not raw.startswith(PERSONAL_TOKEN_PREFIX):
            return None
        address = _address(request)
        _refuse_if_locked_out(address)
        found = personal_token_authenticate(raw=raw)
        if found is None:
            wait = bearer_failure_record(address=address, kind="personal")
            if wait is not None:
                raise BearerThrottled(wait)
            raise AuthenticationFailed(
                "The API token is not valid (unknown, expired or revoked).",
                code="token_not_valid",
            )
        return found

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="api"'


class PawJWTAuthentication(JWTAuthentication):
    """``Authorization: Bearer <access token>``, as simplejwt checks it (signature, expiry,
    type, active user), plus: the token's ``token_version`` claim must equal the user's
    current one, so tokens issued before a logout or password change fail at once (401,
    code ``token_revoked``). One query: the user's row, read on every request. A token
    that fails counts against the client's address (see the module docstring)."""

    bearer_failures_counted = True  # as PersonalTokenAuthentication's

    def authenticate(self, request: Request) -> tuple[User, Token] | None:
        """simplejwt's ``authenticate`` (no ``Bearer`` header: ``None``), with the address's
        bearer failures checked first and this one counted: raises ``BearerThrottled``
        (429) past the limit, else what simplejwt raises (401)."""
        header = self.get_header(request)
        if header is None:
            return None
        address = _address(request)
        try:
            raw = self.get_raw_token(header)
            if raw is None:
                return None
            _refuse_if_locked_out(address)
            validated = self.get_validated_token(raw)
            return self.get_user(validated), validated
        except AuthenticationFailed:  # InvalidToken too
            wait = bearer_failure_record(address=address, kind="jwt")
            if wait is not None:
                raise BearerThrottled(wait) from None
            raise

    def get_user(self, validated_token: Token) -> User:
        # simplejwt's JWTAuthentication.get_user, except for the query: QuerySet.get builds
        # and compiles its statement anew on every request, twice the CPU of a raw one
        # (0.27 against 0.13 ms measured); the row is still read on every request.
        try:
            user_id = validated_token[api_settings.USER_ID_CLAIM]
        except KeyError as error:
            raise InvalidToken(_("Token contained no recognizable user identification")) from error
        column = User._meta.get_field(api_settings.USER_ID_FIELD).column
        query = f'SELECT * FROM "{User._meta.db_table}" WHERE "{column}" = %s'  # noqa: S608 - the model's names
        user = next(iter(User.objects.raw(query, [user_id])), None)
        if user is None:
            raise AuthenticationFailed(_("User not found"), code="user_not_found")
        if api_settings.CHECK_USER_IS_ACTIVE and not user.is_active:
            raise AuthenticationFailed(_("User is inactive"), code="user_inactive")
        if api_settings.CHECK_REVOKE_TOKEN and validated_token.get(
            api_settings.REVOKE_TOKEN_CLAIM
        ) != get_md5_hash_password(user.password):
            raise AuthenticationFailed(
                _("The user's password has been changed."), code="password_changed"
            )
        if validated_token.get(TOKEN_VERSION_CLAIM) != user.token_version:
            raise AuthenticationFailed(
                "The token was revoked (logout or password change).", code="token_revoked"
            )
        return user
