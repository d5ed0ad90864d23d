"""Writes of datasources, their validation for runs, URLs and connection tests."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from django.db import IntegrityError, transaction
from django.utils import timezone

from paw_project.errors import Conflict, DomainError, InvalidRequest
from secrets_vault.connections import (
    PAW_DATABASE_CODE,
    PAW_DATABASE_MESSAGE,
    ConnectionTestResult,
    UserPrivileges,
    connection_is_paw_database,
    connection_is_secret_field,
    connection_resolved_check,
    connection_test,
    connection_url,
    database_connection,
    driver_message,
    user_privileges,
)
from secrets_vault.masking import mask_text, secret_values_register
from secrets_vault.models import Datasource
from secrets_vault.placeholders import placeholder_names, placeholders_substitute
from secrets_vault.selectors import secrets_lookup
from secrets_vault.services.secrets import Resolved, model_validate, placeholders_resolve

if TYPE_CHECKING:
    from accounts.models import User

logger = logging.getLogger(__name__)

DATASOURCE_FIELDS = (
    "slug", "name", "description", "dialect", "connection", "read_only", "enabled",
    "allowed_hosts", "allow_privileged_user",
)  # fmt: skip
#: Seconds the check of a read-only datasource's user may take to connect when it is saved.
PRIVILEGES_CONNECT_TIMEOUT = 3
#: The error code of a read-only datasource whose user can do more than read.
PRIVILEGED_CODE = "datasource_user_privileged"


def datasource_create(**fields: Any) -> Datasource:
    """Create a datasource from ``DATASOURCE_FIELDS`` keyword arguments.

    Raises :class:`InvalidRequest` for bad fields (a literal password above all: see
    ``connections.connection_validate``) and :class:`Conflict` when the slug is taken.
    """
    unknown = set(fields) - set(DATASOURCE_FIELDS)
    if unknown:
        raise InvalidRequest(f"Unknown field(s): {', '.join(sorted(unknown))}.")
    if Datasource.objects.filter(slug=fields.get("slug")).exists():
        raise Conflict(f"A datasource '{fields['slug']}' already exists.", code="datasource_exists")
    return datasource_save(datasource=Datasource(**fields))


def datasource_update(*, datasource: Datasource, **fields: Any) -> Datasource:
    """Change the given fields of a datasource (same rules as :func:`datasource_create`)."""
    unknown = set(fields) - set(DATASOURCE_FIELDS)
    if unknown:
        raise InvalidRequest(f"Unknown field(s): {', '.join(sorted(unknown))}.")
    for name, value in fields.items():
        setattr(datasource, name, value)
    return datasource_save(datasource=datasource)


def datasource_paw_database_check(*, datasource: Datasource) -> None:
    """Refuse a datasource whose connection, as written and with the operator's (global)
    secrets resolved where they exist, reaches PAW's own database
    (``connections.connection_is_paw_database``): :class:`InvalidRequest`
    ``datasource_is_paw_database``. Placeholders without a global secret are checked
    when resolved at run time (:func:`datasource_resolve`)."""
    connection = datasource.connection if isinstance(datasource.connection, dict) else {}
    names = placeholder_names(connection)
    found = secrets_lookup(user=None, names=names)
    # A placeholder without a global secret stays as written (it names no database yet).
    values = {name: "{secret:" + name + "}" for name in names}
    values.update(
        {name: secret.value for name, secret in found.items() if isinstance(secret.value, str)}
    )
    resolved = placeholders_substitute(connection, values)
    if connection_is_paw_database(dialect=datasource.dialect, connection=resolved):
        raise InvalidRequest(
            PAW_DATABASE_MESSAGE,
            code=PAW_DATABASE_CODE,
            extra={"fields": {"connection": [PAW_DATABASE_MESSAGE]}},
        )


def datasource_privileges_check(*, datasource: Datasource) -> UserPrivileges | None:
    """What the database user of a read-only PostgreSQL or MySQL datasource can do beyond
    reading (``connections.user_privileges``), connecting with the operator's (global)
    secrets within :data:`PRIVILEGES_CONNECT_TIMEOUT` seconds. None when there is nothing
    to check (a writable or SQLite datasource) or it cannot be checked now (a placeholder
    with no global secret, e.g. a per-person password; the database unreachable): logged,
    checked again at the next save or connection test. Never raises."""
    if not datasource.read_only or datasource.dialect not in ("postgresql", "mysql"):
        return None
    try:
        connection, _ = datasource_resolved(datasource=datasource, user=None)
        with database_connection(
            dialect=datasource.dialect,
            connection=connection,
            read_only=True,
            timeout=PRIVILEGES_CONNECT_TIMEOUT,
        ) as conn:
            return user_privileges(dialect=datasource.dialect, conn=conn)
    except DomainError as error:
        reason = error.detail
    except Exception as exc:  # any driver failure: not checked now
        reason = driver_message(exc)
    logger.info("datasource %s: its user's privileges not checked (%s)", datasource.slug, reason)
    return None


def _privileges_record(*, datasource: Datasource, privileges: UserPrivileges | None) -> None:
    """Note a check's outcome on the (unsaved) datasource."""
    if privileges is None:
        datasource.user_privileges, datasource.privileges_checked_at = {}, None
    else:
        datasource.user_privileges = {
            "refused": list(privileges.refused), "noted": list(privileges.noted),
        }  # fmt: skip
        datasource.privileges_checked_at = timezone.now()


def datasource_privileges_enforce(*, datasource: Datasource) -> None:
    """Check a read-only datasource's database user (:func:`datasource_privileges_check`)
    and note the outcome on it; raise :class:`InvalidRequest`
    ``datasource_user_privileged`` (``extra["privileges"]``, and the field
    ``allow_privileged_user``) when the user can do more than read and the operator did
    not accept that explicitly (``allow_privileged_user``)."""
    privileges = datasource_privileges_check(datasource=datasource)
    _privileges_record(datasource=datasource, privileges=privileges)
    if privileges is None or not privileges.refused or datasource.allow_privileged_user:
        return
    message = (
        f"{privileges.text()} PAW does not save a read-only datasource with such a user: "
        'give it a user that can only read (docs/vault.md, "A read-only database user"), '
        "or accept this one explicitly (allow_privileged_user), knowing that a statement "
        "the check of a read lets through runs with those powers."
    )
    raise InvalidRequest(
        message,
        code=PRIVILEGED_CODE,
        extra={
            "privileges": list(privileges.refused),
            "fields": {"allow_privileged_user": [message]},
        },
    )


def datasource_save(*, datasource: Datasource) -> Datasource:
    """Validate and save a datasource (the admin's edge; see :func:`datasource_create`).
    Raises :class:`InvalidRequest` ``datasource_is_paw_database`` for a connection that
    reaches PAW's own database, ``datasource_user_privileged`` for a read-only one whose
    database user can do more than read (:func:`datasource_privileges_enforce`)."""
    model_validate(datasource)
    datasource_paw_database_check(datasource=datasource)
    datasource_privileges_enforce(datasource=datasource)
    try:
        with transaction.atomic():
            datasource.save()
    except IntegrityError:
        raise Conflict(
            f"A datasource '{datasource.slug}' already exists.", code="datasource_exists"
        ) from None
    logger.info("datasource %s saved", datasource.slug)
    return datasource


def datasource_delete(*, datasource: Datasource) -> None:
    """Delete a datasource. Runs that were given it keep their URL until they end."""
    slug = datasource.slug
    datasource.delete()
    logger.info("datasource %s deleted", slug)


def datasources_validate(*, slugs: Any) -> list[str]:
    """The slugs a run asked for, checked: a list of strings naming enabled datasources.

    Returns them without duplicates, in the order given. Raises :class:`InvalidRequest`
    (400) ``unknown_datasource`` naming every unknown or disabled slug (and
    ``extra["slugs"]``), or ``invalid`` when ``slugs`` is not a list of strings.
    Used by ``run_start`` before a run is created.
    """
    if slugs is None:
        return []
    if not isinstance(slugs, list | tuple) or not all(isinstance(s, str) for s in slugs):
        raise InvalidRequest("datasources must be a list of datasource slugs.")
    wanted = list(dict.fromkeys(slugs))
    known = set(
        Datasource.objects.filter(slug__in=wanted, enabled=True).values_list("slug", flat=True)
    )
    unknown = [slug for slug in wanted if slug not in known]
    if unknown:
        raise InvalidRequest(
            f"Unknown or disabled datasource(s): {', '.join(unknown)}. "
            "GET /api/datasources lists the available ones.",
            code="unknown_datasource",
            extra={"slugs": unknown},
        )
    return wanted


def datasources_available(*, slugs: list[str]) -> list[str]:
    """The slugs among ``slugs`` that name enabled datasources, in the order given (a
    conversation's default datasources, one of which an operator may have disabled or
    deleted since: a run goes on with the others)."""
    known = set(
        Datasource.objects.filter(slug__in=list(slugs), enabled=True).values_list("slug", flat=True)
    )
    return [slug for slug in dict.fromkeys(slugs) if slug in known]


@dataclass(frozen=True)
class DatasourceConnection:
    """A datasource ready for a sandbox: ``url`` (placeholders resolved), the
    ``secret_values`` in it (``NAME → value``, with URL-encoded variants named
    ``NAME:urlencoded`` and, when it holds any secret, the whole URL under the
    datasource's variable name) and the ids of the secrets used."""

    datasource: Datasource
    url: str = field(repr=False)
    secret_values: dict[str, str] = field(repr=False)
    secret_ids: list[int]


def datasource_resolve(*, datasource: Datasource, user: User | None) -> Resolved:
    """A datasource's connection settings with their placeholders resolved, checked.

    Only fields that are secrets by nature (``password``, options named like a password
    or secret: ``connections.connection_is_secret_field``) resolve ``user``'s own secret
    first; host, port, database, user and the other options resolve only the operator's
    global secrets, so a person's secret can never say where the operator's password is
    sent. The result passes ``connections.connection_resolved_check`` and never reaches
    PAW's own database.

    Raises :class:`InvalidRequest` (prefixed with the datasource's slug):
    ``secret_missing`` / ``secret_undecryptable``, ``invalid_connection`` for a resolved
    field that is not acceptable (a host list, a bad port...), ``datasource_is_paw_database``.
    """
    connection = datasource.connection if isinstance(datasource.connection, dict) else {}
    secret_part: dict[str, Any] = {}
    plain_part: dict[str, Any] = {}
    for key, value in connection.items():
        if key == "options" and isinstance(value, dict):
            for name, item in value.items():
                side = secret_part if connection_is_secret_field(("options", name)) else plain_part
                side.setdefault("options", {})[name] = item
        elif connection_is_secret_field((key,)):
            secret_part[key] = value
        else:
            plain_part[key] = value
    prefix = f"Datasource '{datasource.slug}': "
    try:
        own = placeholders_resolve(user=user, obj=secret_part)
        operator = placeholders_resolve(user=None, obj=plain_part)
    except InvalidRequest as error:
        raise InvalidRequest(prefix + error.detail, code=error.code, extra=error.extra) from None
    value: dict[str, Any] = {**operator.value}
    for key, item in own.value.items():
        if key == "options":
            value["options"] = {**value.get("options", {}), **item}
        else:
            value[key] = item
    if "options" in connection and isinstance(connection["options"], dict):
        # Keep the operator's order of options.
        value["options"] = {k: value["options"][k] for k in connection["options"]}
    try:
        connection_resolved_check(dialect=datasource.dialect, connection=value)
    except ValueError as error:
        raise InvalidRequest(prefix + str(error), code="invalid_connection") from None
    if connection_is_paw_database(dialect=datasource.dialect, connection=value):
        raise InvalidRequest(prefix + PAW_DATABASE_MESSAGE, code=PAW_DATABASE_CODE)
    return Resolved(
        value=value,
        secret_values={**operator.secret_values, **own.secret_values},
        secret_ids=list(dict.fromkeys(operator.secret_ids + own.secret_ids)),
    )


def datasource_connection(*, datasource: Datasource, user: User | None) -> DatasourceConnection:
    """Resolve a datasource's placeholders for ``user`` (:func:`datasource_resolve`) and
    build its URL.

    Raises :class:`InvalidRequest` as :func:`datasource_resolve` (prefixed with the
    datasource's slug)."""
    resolved = datasource_resolve(datasource=datasource, user=user)
    url = connection_url(
        dialect=datasource.dialect, connection=resolved.value, read_only=datasource.read_only
    )
    values = dict(resolved.secret_values)
    for name, value in resolved.secret_values.items():
        encoded = quote(value, safe="")
        if encoded != value:
            values[f"{name}:urlencoded"] = encoded
    if values:
        # The URL carries the resolved secrets: mask it whole where it appears.
        values[datasource.env_name] = url
    secret_values_register(values)
    return DatasourceConnection(
        datasource=datasource, url=url, secret_values=values, secret_ids=resolved.secret_ids
    )


def datasource_resolved(
    *, datasource: Datasource, user: User | None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The datasource's connection settings resolved and checked for ``user``
    (:func:`datasource_resolve`), and the values to mask in anything a driver says about
    it (``NAME`` and ``NAME:urlencoded`` → value). Raises :class:`InvalidRequest` as
    :func:`datasource_resolve`."""
    resolved = datasource_resolve(datasource=datasource, user=user)
    masked = dict(resolved.secret_values)
    for name, value in resolved.secret_values.items():
        masked[f"{name}:urlencoded"] = quote(value, safe="")
    return resolved.value, masked


def datasource_test(*, datasource: Datasource, user: User | None) -> ConnectionTestResult:
    """Really connect to the datasource (placeholders resolved for ``user``, e.g. the
    operator pressing "Test connection") and report the outcome: for a read-only
    PostgreSQL or MySQL datasource also what its user can do beyond reading (noted on the
    datasource; not ``ok`` when PAW would refuse to save it). Never raises for a
    connection or placeholder problem; the message never contains a secret value."""
    try:
        connection, masked = datasource_resolved(datasource=datasource, user=user)
    except DomainError as error:
        return ConnectionTestResult(False, error.detail)
    result = connection_test(
        dialect=datasource.dialect, connection=connection, read_only=datasource.read_only
    )
    logger.info(
        "datasource %s connection test: %s", datasource.slug, "ok" if result.ok else "failed"
    )
    ok, message = result.ok, mask_text(result.message, masked)
    if result.privileges is not None and datasource.pk is not None:
        _privileges_record(datasource=datasource, privileges=result.privileges)
        Datasource.objects.filter(pk=datasource.pk).update(
            user_privileges=datasource.user_privileges,
            privileges_checked_at=datasource.privileges_checked_at,
        )
        if result.privileges.refused:
            ok = datasource.allow_privileged_user
            message += (
                " Accepted anyway: allow_privileged_user is set."
                if ok
                else " PAW refuses to save this read-only datasource with such a user."
            )
    return ConnectionTestResult(ok, message, privileges=result.privileges)
