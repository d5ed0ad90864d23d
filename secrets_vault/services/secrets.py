"""Writes of secrets, placeholder resolution and re-encryption under the newest key."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from paw_project.errors import Conflict, InvalidRequest
from secrets_vault.fields import UNDECRYPTABLE
from secrets_vault.masking import secret_values_register
from secrets_vault.models import Secret
from secrets_vault.placeholders import placeholder_names, placeholders_substitute
from secrets_vault.selectors import secrets_lookup

if TYPE_CHECKING:
    from accounts.models import User

logger = logging.getLogger(__name__)

#: Longest secret value accepted (characters): it becomes an environment variable.
SECRET_VALUE_MAX_LENGTH = 32_768
#: A person's own secrets: how many, and how long each (characters). They all become
#: environment variables of the person's sandboxes (the kernel refuses an environment of
#: more than a few MiB) and are masked in every event: bounded, one person cannot slow
#: down or break the server for the others.
USER_SECRETS_MAX = 50
USER_SECRET_VALUE_MAX_LENGTH = 8_192


def validation_error_as_domain(error: ValidationError) -> InvalidRequest:
    """A Django ``ValidationError`` as ``InvalidRequest`` (400): one readable ``detail``
    and the messages per field in ``fields``. Messages never contain secret values."""
    if hasattr(error, "error_dict"):
        fields = {
            ("non_field_errors" if name == "__all__" else name): [str(m) for m in messages]
            for name, messages in error.message_dict.items()
        }
    else:
        fields = {"non_field_errors": [str(m) for m in error.messages]}
    detail = " ".join(
        " ".join(messages)
        if name in ("non_field_errors", "__all__")
        else f"{name}: " + " ".join(messages)
        for name, messages in fields.items()
    )
    return InvalidRequest(detail, code="invalid", extra={"fields": fields})


def model_validate(instance: Any, *, exclude: list[str] | None = None) -> None:
    """``full_clean`` the instance, raising :class:`InvalidRequest` instead of Django's
    ``ValidationError``."""
    try:
        instance.full_clean(exclude=exclude)
    except ValidationError as error:
        raise validation_error_as_domain(error) from None


def _value_check(value: Any) -> str:
    if not isinstance(value, str) or value == "":
        raise InvalidRequest("A secret needs a non-empty value.", code="value_required")
    if len(value) > SECRET_VALUE_MAX_LENGTH:
        raise InvalidRequest(
            f"A secret value is at most {SECRET_VALUE_MAX_LENGTH} characters.",
            code="value_too_long",
        )
    if "\x00" in value:
        # It becomes an environment variable, which cannot hold a NUL character.
        raise InvalidRequest("A secret value cannot contain a NUL character.", code="invalid")
    return value


def secret_save(*, secret: Secret, value: str | None = None) -> Secret:
    """Validate and save ``secret`` (new or changed name, scope, owner, description).

    ``value`` replaces the stored value; None keeps it (a new secret needs one). Raises
    :class:`InvalidRequest` for a bad name (pattern ``^[A-Z][A-Z0-9_]{0,63}$``, reserved
    sandbox variables), an empty, oversized or NUL-containing value (a person's own: at
    most ``USER_SECRET_VALUE_MAX_LENGTH``), a person's ``USER_SECRETS_MAX + 1``-th secret
    (``too_many_secrets``), or an owner that does not match the scope; :class:`Conflict`
    when the name is taken in that scope.
    """
    if value is not None:
        secret.value = _value_check(value)
        if secret.scope == Secret.Scope.USER and len(value) > USER_SECRET_VALUE_MAX_LENGTH:
            raise InvalidRequest(
                f"One of your secrets is at most {USER_SECRET_VALUE_MAX_LENGTH} characters.",
                code="value_too_long",
            )
    elif secret.pk is None:
        raise InvalidRequest("A new secret needs a value.", code="value_required")
    own = Secret.objects.filter(scope=Secret.Scope.USER, owner=secret.owner)
    if secret.pk is None and secret.scope == Secret.Scope.USER and own.count() >= USER_SECRETS_MAX:
        raise InvalidRequest(
            f"You have {USER_SECRETS_MAX} secrets, the most one person may keep: delete one "
            "you no longer need first.",
            code="too_many_secrets",
        )
    model_validate(secret, exclude=None if value is not None else ["value"])
    secret.updated_at = timezone.now()
    try:
        with transaction.atomic():
            if secret.pk is None or value is not None:
                secret.save()
            else:
                secret.save(update_fields=["name", "scope", "owner", "description", "updated_at"])
    except IntegrityError:
        raise Conflict(
            f"A secret named {secret.name} was just created in this scope; try again.",
            code="secret_exists",
        ) from None
    logger.info(
        "secret %s saved (scope %s, owner %s)", secret.name, secret.scope, secret.owner_id or "-"
    )
    return secret


def secret_set(
    *, name: str, value: str, user: User | None = None, description: str | None = None
) -> tuple[Secret, bool]:
    """Create or replace the secret ``name``: the user's own, or a global one when
    ``user`` is None. ``description`` None keeps the current one. Returns
    ``(secret, created)``. Errors as :func:`secret_save`."""
    with transaction.atomic():
        query = Secret.objects.select_for_update().defer("value")
        if user is None:
            secret = query.filter(scope=Secret.Scope.GLOBAL, name=name).first()
        else:
            secret = query.filter(scope=Secret.Scope.USER, owner=user, name=name).first()
        created = secret is None
        if secret is None:
            scope = Secret.Scope.GLOBAL if user is None else Secret.Scope.USER
            secret = Secret(name=name, scope=scope, owner=user)
        if description is not None:
            secret.description = description
        return secret_save(secret=secret, value=value), created


def secret_create(
    *, name: str, scope: str, owner: User | None, value: str, description: str = ""
) -> Secret:
    """Create a secret (operators' API). :class:`Conflict` (409) when ``name`` exists in
    that scope (for that owner); other errors as :func:`secret_save`."""
    taken = Secret.objects.filter(name=name, scope=scope)
    if scope == Secret.Scope.USER:
        taken = taken.filter(owner=owner)
    if taken.exists():
        raise Conflict(f"A secret named {name} already exists in this scope.", code="secret_exists")
    secret = Secret(name=name, scope=scope, owner=owner, description=description)
    return secret_save(secret=secret, value=value)


def secret_update(
    *, secret: Secret, value: str | None = None, description: str | None = None
) -> Secret:
    """Change a secret's value and/or description (None keeps it)."""
    if description is not None:
        secret.description = description
    return secret_save(secret=secret, value=value)


def secret_delete(*, secret: Secret) -> None:
    """Delete a secret. Sandboxes already running keep what they were given."""
    name, scope = secret.name, secret.scope
    secret.delete()
    logger.info("secret %s deleted (scope %s)", name, scope)


def secrets_mark_used(*, secret_ids: list[int]) -> None:
    """Note that these secrets were just handed out (``last_used_at``)."""
    if secret_ids:
        Secret.objects.filter(pk__in=secret_ids).update(last_used_at=timezone.now())


@dataclass(frozen=True)
class ReencryptResult:
    """``rewritten``: how many values were re-encrypted; ``undecryptable``: the secrets
    (``NAME`` or ``NAME (user USERNAME)``) that no configured key opens, left as they are."""

    rewritten: int
    undecryptable: list[str] = field(default_factory=list)


def secrets_reencrypt() -> ReencryptResult:
    """Rewrite every secret value under the newest key (``PAW_SECRET_KEY`` with the first
    of ``PAW_SALT_KEYS``), one row at a time under a row lock, so older keys can then be
    removed from ``PAW_SECRET_KEY_FALLBACKS`` / ``PAW_SALT_KEYS``. Values no configured
    key opens are reported, not touched. Idempotent."""
    rewritten, undecryptable = 0, []
    for pk in Secret.objects.order_by("pk").values_list("pk", flat=True):
        with transaction.atomic():
            secret = Secret.objects.select_for_update().filter(pk=pk).first()
            if secret is None:
                continue
            if secret.value is UNDECRYPTABLE:
                owner = f" (user {secret.owner.username})" if secret.owner_id else ""
                undecryptable.append(f"{secret.name}{owner}")
                continue
            # update() encrypts again with the first (newest) key; updated_at is the
            # value's date and does not change.
            Secret.objects.filter(pk=pk).update(value=secret.value)
            rewritten += 1
    logger.info("re-encrypted %d secret(s); %d undecryptable", rewritten, len(undecryptable))
    return ReencryptResult(rewritten=rewritten, undecryptable=undecryptable)


@dataclass(frozen=True)
class Resolved:
    """A value with its placeholders resolved, and the secrets that went into it:
    ``secret_values`` (``NAME → value``, for masking) and ``secret_ids``."""

    value: Any = field(repr=False)
    secret_values: dict[str, str] = field(repr=False)
    secret_ids: list[int]


def placeholders_resolve(*, user: User | None, obj: Any) -> Resolved:
    """Resolve every ``{secret:NAME}`` in ``obj`` (strings, dict values and lists,
    recursively): the user's own secret first, then a global one (``user=None``: global
    ones only). Values are inserted as is, never expanded again. A datasource resolves
    only its secret fields with a user (``datasources.datasource_resolve``): a person's
    secret must never choose where the operator's credentials go.

    Raises :class:`InvalidRequest` ``secret_missing`` naming every unknown name (and
    ``extra["names"]``), or ``secret_undecryptable`` naming a secret no configured key
    opens. Never puts a value in an error. The values are registered for log masking.
    """
    names = placeholder_names(obj)
    found = secrets_lookup(user=user, names=names)
    missing = [name for name in names if name not in found]
    if missing:
        listed = ", ".join(missing)
        raise InvalidRequest(
            f"No secret named {listed}: add it (yours via /api/secrets, or a global one in "
            f"the admin) for the placeholder{'s' if len(missing) > 1 else ''} "
            + ", ".join(f"{{secret:{name}}}" for name in missing)
            + ".",
            code="secret_missing",
            extra={"names": missing},
        )
    broken = [name for name in names if found[name].value is UNDECRYPTABLE]
    if broken:
        raise InvalidRequest(
            f"The secret {', '.join(broken)} cannot be decrypted with the server's keys; "
            "set it again.",
            code="secret_undecryptable",
            extra={"names": broken},
        )
    values = {name: found[name].value for name in names}
    secret_values_register(values)
    return Resolved(
        value=placeholders_substitute(obj, values),
        secret_values=values,
        secret_ids=[found[name].pk for name in names],
    )
