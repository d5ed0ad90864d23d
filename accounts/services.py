"""Writes for accounts: registration, JWT pairs, refresh with rotation, revocation."""

from __future__ import annotations

import logging

from django.contrib.auth import authenticate, password_validation
from django.contrib.auth.models import update_last_login
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.http import HttpRequest
from rest_framework_simplejwt.exceptions import TokenError
from rest_framework_simplejwt.token_blacklist.models import BlacklistedToken, OutstandingToken
from rest_framework_simplejwt.utils import datetime_from_epoch

from accounts.models import User
from accounts.tokens import TOKEN_VERSION_CLAIM, PawRefreshToken
from paw_project import broadcast
from paw_project.errors import Conflict, InvalidRequest, Unauthenticated

logger = logging.getLogger(__name__)


def _password_check(password: str, user: User, field: str) -> None:
    """Django's password validators (``AUTH_PASSWORD_VALIDATORS``) → 400 on ``field``."""
    try:
        password_validation.validate_password(password, user=user)
    except ValidationError as error:
        raise InvalidRequest(
            " ".join(error.messages),
            code="password_invalid",
            extra={"fields": {field: error.messages}},
        ) from error


def user_register(*, username: str, password: str, email: str = "") -> User:
    """Create an active, unprivileged user.

    ``username`` must already satisfy the model's validators (the API serializer checks
    them). Raises ``InvalidRequest`` (400, ``password_invalid``) when Django's password
    validators refuse ``password``, ``Conflict`` (409, ``username_taken``) when the name is
    in use (case-insensitively, so ``Alice`` and ``alice`` are not two people; a database
    constraint holds it under concurrent registrations). The name is NFKC-normalized first.
    """
    # NFKC, as Django's own forms do: "ａｌｉｃｅ" (full width) is "alice".
    username = User.normalize_username(username)
    user = User(username=username, email=User.objects.normalize_email(email))
    _password_check(password, user, "password")
    user.set_password(password)
    taken = Conflict("That username is taken.", code="username_taken")
    if User.objects.filter(username__iexact=username).exists():
        raise taken
    try:
        with transaction.atomic():
            user.save()
    except IntegrityError as error:  # a concurrent registration of the same name
        raise taken from error
    return user


def auth_token_pair_for(*, user: User) -> dict[str, str]:
    """A new ``{"access", "refresh"}`` pair for ``user`` carrying its ``token_version``
    (the refresh token is recorded as outstanding, so it can be blacklisted)."""
    refresh = PawRefreshToken.for_user(user)
    return {"access": str(refresh.access_token), "refresh": str(refresh)}


def auth_login(*, username: str, password: str, request: HttpRequest | None = None) -> dict:
    """Check the credentials and return a token pair (see :func:`auth_token_pair_for`);
    records ``last_login``. Raises ``Unauthenticated`` (401, ``invalid_credentials``) for a
    wrong name or password or an inactive user (one answer for all, so names cannot be
    probed)."""
    user = authenticate(request, username=username, password=password)
    if user is None or not user.is_active:
        raise Unauthenticated(
            "No active account found with these credentials.", code="invalid_credentials"
        )
    update_last_login(None, user)
    return auth_token_pair_for(user=user)


def auth_token_refresh(*, refresh: str) -> dict[str, str]:
    """Rotate a refresh token: return a new ``{"access", "refresh"}`` pair and blacklist the
    one given, which can then never be used again.

    Raises ``Unauthenticated`` (401, ``token_not_valid``) for a malformed, expired,
    blacklisted or already rotated token or an inactive user, and (``token_revoked``) when
    the token predates the user's latest logout or password change. Two concurrent
    refreshes with the same token: exactly one wins (the blacklist row is unique).
    """
    try:
        token = PawRefreshToken(refresh)
    except TokenError as error:
        raise Unauthenticated(str(error), code="token_not_valid") from error
    user = User.objects.filter(pk=token.get("user_id"), is_active=True).first()
    if user is None:
        raise Unauthenticated("No active account for this token.", code="token_not_valid")
    if token.get(TOKEN_VERSION_CLAIM) != user.token_version:
        raise Unauthenticated(
            "The token was revoked (logout or password change).", code="token_revoked"
        )
    with transaction.atomic():
        outstanding, _ = OutstandingToken.objects.get_or_create(
            jti=token["jti"],
            defaults={
                "user": user,
                "token": refresh,
                "created_at": token.current_time,
                "expires_at": datetime_from_epoch(token["exp"]),
            },
        )
        _, blacklisted_now = BlacklistedToken.objects.get_or_create(token=outstanding)
        if not blacklisted_now:
            raise Unauthenticated("Token is blacklisted", code="token_not_valid")
        return auth_token_pair_for(user=user)


def auth_tokens_revoke(*, user: User, sessions_too: bool = False) -> None:
    """Revoke every access and refresh token of ``user`` issued so far (bumps
    ``token_version`` atomically in the database; ``user`` is refreshed), and, once that
    is committed, close the user's websockets opened with a token (code 4401): a socket
    of a revoked token must not go on streaming or deciding approvals. With
    ``sessions_too`` (a password change, which ends the user's sessions) the sockets of
    browser sessions close as well."""
    User.objects.filter(pk=user.pk).update(token_version=F("token_version") + 1)
    user.refresh_from_db(fields=["token_version"])
    user_id = user.pk
    transaction.on_commit(lambda: _sockets_close(user_id, sessions_too=sessions_too))


def session_sockets_close(*, session_key: str | None) -> None:
    """Close the websockets a browser session opened (code 4401): the session signed out.
    Call after the logout; a no-op without a session key."""
    if not session_key:
        return
    try:
        broadcast.group_send(broadcast.session_group(session_key), {"type": "session.signed_out"})
    except Exception:  # the session is gone either way; the sockets' next acts are refused
        logger.exception("could not close a signed-out session's websockets")


def _sockets_close(user_id: int, *, sessions_too: bool) -> None:
    message = {"type": "session.revoked", "sessions": sessions_too}
    try:
        broadcast.group_send(broadcast.user_group(user_id), message)
    except Exception:  # the tokens are revoked either way; a socket's next act is refused
        logger.exception("could not tell user %s's websockets of the revocation", user_id)


def user_password_change(*, user: User, old_password: str, new_password: str) -> dict:
    """Change the password, revoke every earlier token, and return a fresh token pair.

    Raises ``InvalidRequest`` (400): ``wrong_password`` when ``old_password`` is wrong,
    ``password_invalid`` when the validators refuse ``new_password``. Django sessions made
    with the old password end too (their hash no longer matches)."""
    if not user.check_password(old_password):
        raise InvalidRequest(
            "The current password is wrong.",
            code="wrong_password",
            extra={"fields": {"old_password": ["The current password is wrong."]}},
        )
    _password_check(new_password, user, "new_password")
    with transaction.atomic():
        user.set_password(new_password)
        user.save(update_fields=["password"])
        auth_tokens_revoke(user=user, sessions_too=True)
        return auth_token_pair_for(user=user)
