"""API authentication: personal API tokens (``paw_…``) and JWT bearer tokens, both checked
against the user's ``token_version``.

Failed bearer authentications are limited per client address (``PAW_THROTTLE_BAD_TOKENS``,
``accounts.services.bearer_failure_record``): past the limit a token from that address
that fails is answered ``429 {"detail", "code": "throttled"}`` with ``Retry-After``
instead of 401, until the oldest counted failure leaves the window. A valid token is
always accepted: the people sharing a guesser's address are not locked out.
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
        """simplejwt's ``authenticate`` (no ``Bearer`` header: ``None``), a failure counted
        against the address: raises ``BearerThrottled`` (429) past the limit, else what
        simplejwt raises (401)."""
        header = self.get_header(request)
        if header is None:
            return None
        address = _address(request)
        try:
            raw = self.get_raw_token(header)
            if raw is None:
                return None
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


def scope_credentials_valid(scope: dict) -> bool:
    """Whether the ASGI HTTP request of ``scope`` carries credentials that authenticate:
    a session cookie of a signed-in, active user, or a valid bearer token (a personal API
    token, or a JWT access token with its current ``token_version``). Used by the body
    limit before a request may send more than an anonymous one (``paw_project.
    asgi_limits``): an ``Authorization`` header of any kind, or any session cookie, is not
    enough. Blocking (database reads): call it from a thread. Failed tokens are not
    counted here; the view that reads the request counts them."""
    from importlib import import_module

    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.contrib.sessions.backends.base import SessionBase
    from django.http.cookie import parse_cookie

    headers = {name: value for name, value in scope.get("headers", ())}
    authorization = headers.get(b"authorization", b"").split()
    if len(authorization) == 2 and authorization[0].lower() == b"bearer":
        try:
            raw = authorization[1].decode("ascii")
        except UnicodeDecodeError:
            return False
        if raw.startswith(PERSONAL_TOKEN_PREFIX):
            return personal_token_authenticate(raw=raw) is not None
        try:
            authenticator = PawJWTAuthentication()
            user = authenticator.get_user(authenticator.get_validated_token(raw.encode()))
        except (AuthenticationFailed, InvalidToken):
            return False
        return user is not None and user.is_active
    if authorization:
        return False  # another scheme (Basic...): PAW accepts none
    cookie = parse_cookie(headers.get(b"cookie", b"").decode("latin-1"))
    key = cookie.get(settings.SESSION_COOKIE_NAME)
    if not key:
        return False
    session: SessionBase = import_module(settings.SESSION_ENGINE).SessionStore(key)
    user_id = session.get("_auth_user_id")
    if user_id is None:
        return False
    return get_user_model().objects.filter(pk=user_id, is_active=True).exists()
