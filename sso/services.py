"""The rules of a single sign-on: who may come in, as which PAW user, with which flags.

The protocol (the authorization code flow with PKCE and a nonce, the token exchange, the
ID token's signature, issuer, audience and expiry) is :mod:`sso.backends`' business; what
reaches :func:`sso_sign_in` are the claims of a checked ID token and the provider's
userinfo. Claims are those of OpenID Connect Core 1.0 §5.1.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from accounts.models import User
from accounts.services import user_create_external
from paw_project.errors import Forbidden
from sso.models import OidcIdentity
from teams.services import user_join_default_team, user_teams_from_claim

logger = logging.getLogger(__name__)

_TRUE = (True, 1, "true", "True", "1", "yes")


class SignOnRefused(Forbidden):
    """The provider signed the person in, but PAW does not let them in (403). ``code``
    says why: ``token_invalid``, ``domain_not_allowed``, ``email_unverified``,
    ``group_not_allowed``, ``account_disabled``; ``detail`` is for the person."""

    code = "sign_on_refused"
    default_detail = "The sign-in was refused."


def claim_matches(claims: dict[str, Any], rule: str) -> bool:
    """Whether ``claims`` satisfy ``rule``: ``CLAIM`` (the claim is true: ``true``, ``1``,
    ``"true"``, ``"yes"``) or ``CLAIM=VALUE`` (the claim equals ``VALUE`` or is a list
    holding it). An empty rule matches nothing."""
    if not rule:
        return False
    name, sep, wanted = rule.partition("=")
    value = claims.get(name)
    if not sep:
        return value in _TRUE
    if isinstance(value, list | tuple):
        return wanted in [str(item) for item in value]
    return value is not None and str(value) == wanted


#: The most values of a list claim (groups, teams) PAW reads; the rest are ignored.
CLAIM_VALUES_MAX = 200
#: The longest claim value PAW reads (a team's name's limit); a longer one is ignored.
CLAIM_VALUE_MAX_LENGTH = 150


def _claim_values(claims: dict[str, Any], name: str) -> set[str]:
    """The claim ``name`` as a set of strings: one string, or the string items of a list.
    Anything else (numbers, objects, nested lists, ``null``) is ignored rather than turned
    into text, as is a string longer than :data:`CLAIM_VALUE_MAX_LENGTH`; at most
    :data:`CLAIM_VALUES_MAX` values are kept (the first, in the claim's order), so a
    provider's oversized claim bounds the work of a sign-in."""
    value = claims.get(name)
    items = [value] if isinstance(value, str) else value if isinstance(value, list | tuple) else []
    kept: dict[str, None] = {}
    for item in items:
        if isinstance(item, str) and len(item) <= CLAIM_VALUE_MAX_LENGTH:
            kept[item] = None
            if len(kept) == CLAIM_VALUES_MAX:
                if len(items) > CLAIM_VALUES_MAX:
                    logger.warning("claim %s: only its first %d values read", name, len(kept))
                break
    return set(kept)


def _groups(claims: dict[str, Any]) -> set[str]:
    return _claim_values(claims, settings.PAW_OIDC_GROUPS_CLAIM)


def sign_on_check(claims: dict[str, Any]) -> None:
    """Raise :class:`SignOnRefused` unless the person may use PAW: their e-mail's domain
    is one of ``PAW_OIDC_ALLOWED_DOMAINS`` (when set; an address the provider marks
    ``email_verified: false`` does not count) and they are in one of
    ``PAW_OIDC_ALLOWED_GROUPS`` (when set). Checked at every sign-in."""
    domains = settings.PAW_OIDC_ALLOWED_DOMAINS
    if domains:
        email = str(claims.get("email") or "")
        domain = email.rpartition("@")[2].lower() if "@" in email else ""
        if domain not in domains:
            raise SignOnRefused(
                f"Accounts of {domain or 'an unknown domain'} may not use this PAW "
                f"(allowed: {', '.join(domains)}).",
                code="domain_not_allowed",
            )
        if claims.get("email_verified") is False:
            raise SignOnRefused(
                "Your e-mail address is not verified at the sign-in service.",
                code="email_unverified",
            )
    allowed = settings.PAW_OIDC_ALLOWED_GROUPS
    if allowed and not _groups(claims) & set(allowed):
        raise SignOnRefused(
            "You are not in a group allowed to use this PAW.", code="group_not_allowed"
        )


def _wanted_username(claims: dict[str, Any]) -> str:
    for value in (
        claims.get(settings.PAW_OIDC_USERNAME_CLAIM),
        str(claims.get("email") or "").partition("@")[0],
        claims.get("sub"),
    ):
        if isinstance(value, str) and value.strip():
            return value.strip()
    return "user"


def _flags_update(user: User, claims: dict[str, Any]) -> list[str]:
    """Set ``is_staff`` / ``is_superuser`` from their claims (when configured) and the
    e-mail from the claims; the changed field names."""
    changed = []
    for field, rule in (
        ("is_staff", settings.PAW_OIDC_STAFF_CLAIM),
        ("is_superuser", settings.PAW_OIDC_SUPERUSER_CLAIM),
    ):
        if rule and getattr(user, field) != claim_matches(claims, rule):
            setattr(user, field, claim_matches(claims, rule))
            changed.append(field)
    email = User.objects.normalize_email(str(claims.get("email") or ""))
    if email and email != user.email:
        user.email = email
        changed.append("email")
    return changed


def sso_sign_in(*, issuer: str, claims: dict[str, Any]) -> User:
    """The PAW user the person with ``claims`` (their checked ID token's claims with the
    userinfo's over them; ``sub`` required) at ``issuer`` signs in as.

    The first sign-in of an identity creates a new user (named from
    ``PAW_OIDC_USERNAME_CLAIM``, else the e-mail's local part, else ``sub``;
    NFKC-normalized and unique ignoring case, see
    :func:`accounts.services.username_free_variant`) and links it; later ones find it by
    ``(issuer, sub)``. Every sign-in applies :func:`sign_on_check`, sets the staff and
    superuser flags from their claims and updates the e-mail address; with
    ``PAW_OIDC_TEAMS_CLAIM``, sets the person's teams to those the claim names (a new user
    joins ``PAW_DEFAULT_TEAM`` first; the claim then decides). Raises
    :class:`SignOnRefused` (``account_disabled`` for an inactive user)."""
    sign_on_check(claims)
    subject = str(claims["sub"])
    with transaction.atomic():
        identity = (
            OidcIdentity.objects.select_for_update()
            .select_related("user")
            .filter(issuer=issuer, subject=subject)
            .first()
        )
        if identity is None:
            try:
                with transaction.atomic():
                    user = user_create_external(
                        username=_wanted_username(claims), email=str(claims.get("email") or "")
                    )
                    identity = OidcIdentity.objects.create(
                        issuer=issuer, subject=subject, user=user
                    )
            except IntegrityError:  # the same person's first sign-in in two tabs at once
                identity = OidcIdentity.objects.select_related("user").get(
                    issuer=issuer, subject=subject
                )
            else:
                user_join_default_team(user=user)
                logger.info("single sign-on: new user %s for %s", user.username, identity)
        user = identity.user
        if not user.is_active:
            raise SignOnRefused("This account is disabled.", code="account_disabled")
        changed = _flags_update(user, claims)
        if changed:
            user.save(update_fields=changed)
        if settings.PAW_OIDC_TEAMS_CLAIM:
            user_teams_from_claim(
                user=user,
                names=_claim_values(claims, settings.PAW_OIDC_TEAMS_CLAIM),
                create=settings.PAW_OIDC_CREATE_TEAMS,
            )
        identity.last_sign_in_at = timezone.now()
        identity.save(update_fields=["last_sign_in_at"])
    return user
