"""Writes for accounts: registration, JWT pairs, refresh with rotation, revocation, personal
API tokens."""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import logging
import re
import secrets
from datetime import timedelta

from django.conf import settings
from django.contrib.auth import authenticate, password_validation
from django.contrib.auth.models import update_last_login
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.db.models import F
from django.http import HttpRequest
from django.utils import timezone
from rest_framework_simplejwt.exceptions import TokenError
from rest_framework_simplejwt.token_blacklist.models import BlacklistedToken, OutstandingToken
from rest_framework_simplejwt.utils import datetime_from_epoch

from accounts.models import PersonalToken, User
from accounts.tokens import TOKEN_VERSION_CLAIM, PawRefreshToken
from paw_project import broadcast, metrics, throttles
from paw_project.errors import Conflict, InvalidRequest, NotFound, Unauthenticated
from teams.services import user_join_default_team

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
    The new user joins ``PAW_DEFAULT_TEAM`` when set.
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
            user_join_default_team(user=user)
    except IntegrityError as error:  # a concurrent registration of the same name
        raise taken from error
    return user


#: What a username may hold (Django's ``UnicodeUsernameValidator``); anything else in a
#: name given by an identity provider becomes ``-``.
_NOT_IN_USERNAME = re.compile(r"[^\w.@+-]+")
USERNAME_MAX_LENGTH = 150


def username_free_variant(wanted: str) -> str:
    """A username for a new account made from ``wanted`` (any text, e.g. an identity
    provider's ``preferred_username``): NFKC-normalized, characters the username
    validator refuses turned into ``-``, at most 150 characters (``user`` when nothing
    is left), then the first of ``name``, ``name-2``, ``name-3`` … that no account has,
    ignoring case. Not reserved: :func:`user_create_external` retries on a race."""
    name = _NOT_IN_USERNAME.sub("-", User.normalize_username(wanted)).strip("-.")
    name = name[:USERNAME_MAX_LENGTH] or "user"
    if not User.objects.filter(username__iexact=name).exists():
        return name
    for number in range(2, 100):
        suffix = f"-{number}"
        candidate = name[: USERNAME_MAX_LENGTH - len(suffix)] + suffix
        if not User.objects.filter(username__iexact=candidate).exists():
            return candidate
    suffix = f"-{secrets.token_hex(4)}"  # a hundred namesakes: stop counting
    return name[: USERNAME_MAX_LENGTH - len(suffix)] + suffix


def user_create_external(*, username: str, email: str = "", attempts: int = 5) -> User:
    """Create an active, unprivileged user who signs in elsewhere (single sign-on): no
    usable password, named :func:`username_free_variant` of ``username`` (unique ignoring
    case, as the database constraint holds it; a name taken meanwhile by a concurrent
    registration moves on to the next variant, up to ``attempts`` times, then raises
    ``Conflict`` ``username_taken``). Call inside the caller's transaction, if any."""
    for _ in range(attempts):
        user = User(
            username=username_free_variant(username),
            email=User.objects.normalize_email(email),
        )
        user.set_unusable_password()
        try:
            with transaction.atomic():
                user.save()
        except IntegrityError:
            continue
        return user
    raise Conflict("No free username could be found.", code="username_taken")


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
    """Revoke every access, refresh and personal API token of ``user`` issued so far (bumps
    ``token_version`` atomically in the database; ``user`` is refreshed; the personal tokens
    made under the old version are deleted, they could never work again), and, once that
    is committed, close the user's websockets opened with a token (code 4401): a socket
    of a revoked token must not go on streaming or deciding approvals. With
    ``sessions_too`` (a password change, which ends the user's sessions) the sockets of
    browser sessions close as well."""
    User.objects.filter(pk=user.pk).update(token_version=F("token_version") + 1)
    user.refresh_from_db(fields=["token_version"])
    PersonalToken.objects.filter(user=user, token_version__lt=user.token_version).delete()
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


def _sockets_close(user_id: int, *, sessions_too: bool, token_id: int | None = None) -> None:
    """Tell the user's websockets their credentials were revoked: all of them opened with a
    token (and browser sessions' with ``sessions_too``), or only those of the personal
    token ``token_id``."""
    message: dict = {"type": "session.revoked", "sessions": sessions_too}
    if token_id is not None:
        message["token_id"] = token_id
    try:
        broadcast.group_send(broadcast.revocation_group(user_id), message)
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


# --- Personal API tokens ------------------------------------------------------------------

#: What every personal token starts with (tells it from a JWT at a glance, and lets secret
#: scanners recognise a leaked one).
PERSONAL_TOKEN_PREFIX = "paw_"  # noqa: S105 - a prefix, not a secret
#: Most personal tokens one person may hold at once.
PERSONAL_TOKENS_MAX = 50
#: Longest lifetime a token may be given, in days (about ten years).
PERSONAL_TOKEN_MAX_DAYS = 3650
#: ``last_used_at`` is written at most this often per token: not one write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def personal_token_hash(raw: str) -> str:
    """The stored form of a token value: SHA-256, hex (64 characters)."""
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()


def personal_token_create(
    *, user: User, name: str, expires_in_days: int | None = None
) -> tuple[PersonalToken, str]:
    """Make a personal API token for ``user``: ``(token, value)``. The value
    (``paw_…``) is returned only here; the database keeps its hash.

    ``name``: 1–100 characters (stripped); ``expires_in_days``: 1 to 3650, or ``None``
    for a token that does not expire. Raises ``InvalidRequest`` (400) ``invalid`` for a
    blank name or an out-of-range lifetime, ``too_many_tokens`` when the user already
    holds ``PERSONAL_TOKENS_MAX`` tokens.
    """
    name = (name or "").strip()
    if not name or len(name) > 100:
        raise InvalidRequest(
            "Give the token a name of 1 to 100 characters.",
            extra={"fields": {"name": ["1 to 100 characters."]}},
        )
    if expires_in_days is not None and not 1 <= expires_in_days <= PERSONAL_TOKEN_MAX_DAYS:
        raise InvalidRequest(
            f"expires_in_days must be from 1 to {PERSONAL_TOKEN_MAX_DAYS}, or left out.",
            extra={"fields": {"expires_in_days": [f"1 to {PERSONAL_TOKEN_MAX_DAYS}."]}},
        )
    with transaction.atomic():
        # The user's row is locked: the count holds against concurrent creations, and the
        # token is made under the token_version a concurrent logout cannot move meanwhile.
        locked = User.objects.select_for_update().get(pk=user.pk)
        if PersonalToken.objects.filter(user=locked).count() >= PERSONAL_TOKENS_MAX:
            raise InvalidRequest(
                f"You already have {PERSONAL_TOKENS_MAX} API tokens: delete one first.",
                code="too_many_tokens",
            )
        raw = PERSONAL_TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = PersonalToken.objects.create(
            user=locked,
            name=name,
            prefix=raw[:12],
            token_hash=personal_token_hash(raw),
            token_version=locked.token_version,
            expires_at=(
                timezone.now() + timedelta(days=expires_in_days) if expires_in_days else None
            ),
        )
    return token, raw


def personal_token_delete(*, user: User, token_id: int) -> None:
    """Revoke (delete) one of ``user``'s personal tokens; it stops working at once, and
    the websockets opened with it close (4401). Raises ``NotFound`` (404) when ``user``
    has no token with that id (another person's is a 404 too)."""
    deleted, _ = PersonalToken.objects.filter(user=user, pk=token_id).delete()
    if not deleted:
        raise NotFound("No such API token.")
    user_id = user.pk
    transaction.on_commit(lambda: _sockets_close(user_id, sessions_too=False, token_id=token_id))


def personal_token_authenticate(*, raw: str) -> tuple[User, PersonalToken] | None:
    """``(user, token)`` for a valid personal token value, else ``None`` (unknown,
    expired, revoked by a logout or password change, or an inactive user). One query;
    ``last_used_at`` is written at most once a minute per token (``LAST_USED_RESOLUTION``)."""
    if not raw.startswith(PERSONAL_TOKEN_PREFIX) or len(raw) > 200:
        return None
    token = (
        PersonalToken.objects.select_related("user")
        .filter(token_hash=personal_token_hash(raw))
        .first()
    )
    if token is None:
        return None
    user = token.user
    now = timezone.now()
    if (
        not user.is_active
        or token.token_version != user.token_version
        or (token.expires_at is not None and token.expires_at <= now)
    ):
        return None
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        PersonalToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return user, token


#: The throttle scope of failed bearer authentications, counted per client address.
BEARER_FAILURE_SCOPE = "bearer"


def bearer_failure_record(*, address: str, kind: str) -> int | None:
    """Count one bearer token of ``kind`` (``personal`` or ``jwt``) from ``address`` that
    was checked and did not authenticate (unknown, malformed, expired, revoked).

    Returns ``None`` when the address's failures are within ``PAW_THROTTLE_BAD_TOKENS``
    (answer this one as the failure it is: 401), else the seconds until the oldest
    counted failure leaves the window (answer 429 with ``Retry-After``). Only failures
    are limited: a valid token is always checked and accepted, so a guesser cannot lock
    out the people who share its address (a NAT, an office, a proxy), and learns nothing
    it did not learn from a 401. IPv6 addresses count by their /64 network, which one
    host usually has whole. Counting is one atomic step of the throttle store, so of a
    burst exactly the limit's number get their 401. Counted in
    ``paw_bearer_auth_failures{kind}``, a refusal in ``paw_throttled_requests{scope=
    "bearer"}``."""
    metrics.bearer_failed(kind=kind)
    wait = throttles.rate_hit(
        settings.PAW_THROTTLE_BAD_TOKENS, BEARER_FAILURE_SCOPE, bearer_failure_key(address)
    )
    if wait is not None:
        metrics.throttled(scope=BEARER_FAILURE_SCOPE)
    return wait


def bearer_failure_key(address: str) -> str:
    """What failed bearer authentications from ``address`` count under: the address, or
    for IPv6 its /64 network (``2001:db8::/64``)."""
    with contextlib.suppress(ValueError):
        parsed = ipaddress.ip_address(address)
        if parsed.version == 6 and parsed.ipv4_mapped is None:
            return str(ipaddress.ip_network(f"{parsed}/64", strict=False))
    return address


def sso_enabled() -> bool:
    """Whether single sign-on is configured (``PAW_OIDC_ISSUER``; the ``sso`` app does the
    signing in)."""
    return bool(settings.PAW_OIDC_ISSUER)
