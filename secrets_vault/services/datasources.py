"""Writes of datasources, their validation for runs, URLs and connection tests."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from django.conf import settings
from django.contrib.auth.models import Group
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from paw_project.errors import Conflict, DomainError, InvalidRequest
from secrets_vault import enqueue
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
from secrets_vault.introspection import VALUES_MARK, entry_text_without_values
from secrets_vault.masking import mask_text, secret_values_register
from secrets_vault.models import Datasource, DatasourceCredential, KnowledgeEntry
from secrets_vault.placeholders import placeholder_names, placeholders_substitute
from secrets_vault.selectors import datasource_list, datasources_for_user, secrets_lookup
from secrets_vault.services.secrets import Resolved, model_validate, placeholders_resolve

if TYPE_CHECKING:
    from accounts.models import User

logger = logging.getLogger(__name__)

DATASOURCE_FIELDS = (
    "slug", "name", "description", "dialect", "connection", "read_only", "enabled",
    "allowed_hosts", "allow_privileged_user", "access", "teams", "sample_values",
    "sensitive_columns",
)  # fmt: skip
#: Seconds the check of a read-only datasource's user may take to connect when it is saved.
PRIVILEGES_CONNECT_TIMEOUT = 3
#: The error code of a read-only datasource whose user can do more than read.
PRIVILEGED_CODE = "datasource_user_privileged"


def datasource_create(**fields: Any) -> Datasource:
    """Create a datasource from ``DATASOURCE_FIELDS`` keyword arguments (``teams``: team
    ids, the teams whose members may use it when ``access`` is ``teams``; ``access``
    defaults to ``teams``, so a new datasource without teams is for staff only).

    Raises :class:`InvalidRequest` for bad fields (a literal password above all: see
    ``connections.connection_validate``; ``unknown_team`` naming a team id that is none)
    and :class:`Conflict` when the slug is taken.
    """
    unknown = set(fields) - set(DATASOURCE_FIELDS)
    if unknown:
        raise InvalidRequest(f"Unknown field(s): {', '.join(sorted(unknown))}.")
    if Datasource.objects.filter(slug=fields.get("slug")).exists():
        raise Conflict(f"A datasource '{fields['slug']}' already exists.", code="datasource_exists")
    teams = _teams_of(fields.pop("teams", None))
    return datasource_save(datasource=Datasource(**fields), teams=teams)


def datasource_update(*, datasource: Datasource, **fields: Any) -> Datasource:
    """Change the given fields of a datasource (same rules as :func:`datasource_create`;
    ``teams``, when given, is the whole list)."""
    unknown = set(fields) - set(DATASOURCE_FIELDS)
    if unknown:
        raise InvalidRequest(f"Unknown field(s): {', '.join(sorted(unknown))}.")
    teams = _teams_of(fields.pop("teams", None))
    for name, value in fields.items():
        setattr(datasource, name, value)
    return datasource_save(datasource=datasource, teams=teams)


def _teams_of(team_ids: Any) -> list[Group] | None:
    """The teams of ``team_ids`` (a list of ids, each once; None: not given). Raises
    :class:`InvalidRequest` ``unknown_team`` naming the ids of no team (and
    ``extra["teams"]``), ``invalid`` for a value that is not a list of integers."""
    if team_ids is None:
        return None
    if not isinstance(team_ids, list | tuple) or not all(
        isinstance(i, int) and not isinstance(i, bool) for i in team_ids
    ):
        raise InvalidRequest("teams must be a list of team ids.", code="invalid")
    wanted = list(dict.fromkeys(team_ids))
    found = {team.pk: team for team in Group.objects.filter(pk__in=wanted)}
    missing = [i for i in wanted if i not in found]
    if missing:
        raise InvalidRequest(
            f"No team with id {', '.join(map(str, missing))}. GET /api/admin/teams lists them.",
            code="unknown_team",
            extra={"teams": missing, "fields": {"teams": [f"Unknown team id(s): {missing}."]}},
        )
    return [found[i] for i in wanted]


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


def datasource_privileges_check(
    *, datasource: Datasource, credential: DatasourceCredential | None = None
) -> UserPrivileges | None:
    """What the database user of a read-only PostgreSQL or MySQL datasource (or, with
    ``credential``, that team's user on it) can do beyond reading
    (``connections.user_privileges``), connecting with the operator's (global) secrets
    within :data:`PRIVILEGES_CONNECT_TIMEOUT` seconds. None when there is nothing to check
    (a writable or SQLite datasource) or it cannot be checked now (a placeholder with no
    global secret, e.g. a per-person password; the database unreachable): logged, checked
    again at the next save or connection test. Never raises."""
    if not datasource.read_only or datasource.dialect not in ("postgresql", "mysql"):
        return None
    try:
        connection, _ = datasource_resolved(datasource=datasource, user=None, credential=credential)
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
    whose = f" (team {credential.team_id}'s user)" if credential is not None else ""
    logger.info(
        "datasource %s%s: its user's privileges not checked (%s)", datasource.slug, whose, reason
    )
    return None


def _privileges_record(
    *, datasource: Datasource | DatasourceCredential, privileges: UserPrivileges | None
) -> None:
    """Note a check's outcome on the (unsaved) datasource or team credential."""
    if privileges is None:
        datasource.user_privileges, datasource.privileges_checked_at = {}, None
    else:
        datasource.user_privileges = {
            "refused": list(privileges.refused), "noted": list(privileges.noted),
        }  # fmt: skip
        datasource.privileges_checked_at = timezone.now()


def datasource_privileges_enforce(
    *, datasource: Datasource, credential: DatasourceCredential | None = None
) -> None:
    """Check a read-only datasource's database user (:func:`datasource_privileges_check`;
    with ``credential``, that team's user) and note the outcome on it (the datasource, or
    the credential); raise :class:`InvalidRequest` ``datasource_user_privileged``
    (``extra["privileges"]``, and the field ``allow_privileged_user``) when the user can do
    more than read and the operator did not accept that explicitly on the datasource
    (``allow_privileged_user``)."""
    privileges = datasource_privileges_check(datasource=datasource, credential=credential)
    _privileges_record(datasource=credential or datasource, privileges=privileges)
    if privileges is None or not privileges.refused or datasource.allow_privileged_user:
        return
    whose = (
        f"The database user {credential.db_user!r} of team {credential.team.name!r}: "
        if credential is not None
        else ""
    )
    message = (
        f"{whose}{privileges.text()} PAW does not save a read-only datasource with such a "
        'user: give it a user that can only read (docs/vault.md, "A read-only database '
        'user"), or accept this one explicitly (allow_privileged_user), knowing that a '
        "statement the check of a read lets through runs with those powers."
    )
    raise InvalidRequest(
        message,
        code=PRIVILEGED_CODE,
        extra={
            "privileges": list(privileges.refused),
            "fields": {"allow_privileged_user": [message]},
        },
    )


def datasource_save(*, datasource: Datasource, teams: list[Group] | None = None) -> Datasource:
    """Validate and save a datasource (the admin's edge; see :func:`datasource_create`),
    and set its ``teams`` when given. Raises :class:`InvalidRequest`
    ``datasource_is_paw_database`` for a connection that reaches PAW's own database,
    ``datasource_user_privileged`` for a read-only one whose database user, or the user of
    one of its team credentials, can do more than read
    (:func:`datasource_privileges_enforce`): nothing is saved then, ``invalid`` naming
    ``sensitive_columns`` for a bad list. Turning ``sample_values`` off or changing
    ``sensitive_columns`` takes the sampled values out of the schema entries at once
    (:func:`schema_values_forget`; the next refresh samples again what is allowed)."""
    model_validate(datasource)
    datasource_paw_database_check(datasource=datasource)
    datasource_privileges_enforce(datasource=datasource)
    credentials = list(datasource.credentials.select_related("team")) if datasource.pk else []
    for credential in credentials:  # their users are checked again with the new settings
        datasource_privileges_enforce(datasource=datasource, credential=credential)
    before = (
        Datasource.objects.filter(pk=datasource.pk)
        .values("sample_values", "sensitive_columns")
        .first()
        if datasource.pk
        else None
    )
    forget = before is not None and (
        (before["sample_values"] and not datasource.sample_values)
        or before["sensitive_columns"] != datasource.sensitive_columns
    )
    try:
        with transaction.atomic():
            datasource.save()
            if forget:
                schema_values_forget(datasource_id=datasource.pk)
            if teams is not None:
                datasource.teams.set(teams)
            for credential in credentials:
                DatasourceCredential.objects.filter(pk=credential.pk).update(
                    user_privileges=credential.user_privileges,
                    privileges_checked_at=credential.privileges_checked_at,
                )
    except IntegrityError:
        raise Conflict(
            f"A datasource '{datasource.slug}' already exists.", code="datasource_exists"
        ) from None
    logger.info("datasource %s saved", datasource.slug)
    return datasource


def schema_values_forget(*, datasource_id: int) -> int:
    """Take every column's values out of the datasource's schema entries, in the caller's
    transaction (``introspection.entry_text_without_values``; their vectors are made
    again, its ``knowledge_version`` bumped): when its operator turns sampling off or
    marks tables or columns sensitive, runs stop seeing values at once, before the next
    refresh. Returns how many entries changed."""
    now = timezone.now()
    changed = []
    for entry in KnowledgeEntry.objects.filter(
        datasource_id=datasource_id, kind=KnowledgeEntry.Kind.SCHEMA, text__contains=VALUES_MARK
    ).only("id", "text"):
        entry.text = entry_text_without_values(entry.text)
        entry.vector, entry.vector_model, entry.updated_at = None, "", now
        changed.append(entry)
    if changed:
        KnowledgeEntry.objects.bulk_update(
            changed, ["text", "vector", "vector_model", "updated_at"], batch_size=500
        )
        Datasource.objects.filter(pk=datasource_id).update(
            knowledge_version=F("knowledge_version") + 1
        )
        if settings.PAW_EMBEDDING_PROVIDER:
            transaction.on_commit(
                lambda: enqueue.knowledge_embed_enqueue(datasource_id=datasource_id)
            )
    return len(changed)


def datasource_delete(*, datasource: Datasource) -> None:
    """Delete a datasource. Runs that were given it keep their URL until they end."""
    slug = datasource.slug
    datasource.delete()
    logger.info("datasource %s deleted", slug)


def datasources_validate(*, slugs: Any, user: User | None) -> list[str]:
    """The slugs a run (or a conversation) of ``user`` asked for, checked: a list of
    strings naming enabled datasources ``user`` may use
    (``selectors.datasources_for_user``).

    Returns them without duplicates, in the order given. Raises :class:`InvalidRequest`
    (400) ``unknown_datasource`` naming every unknown, disabled or not allowed slug (and
    ``extra["slugs"]``; one the user may not use reads as unknown, so the answer does
    not tell it exists), or ``invalid`` when ``slugs`` is not a list of strings.
    Used by ``run_start`` before a run is created.
    """
    if slugs is None:
        return []
    if not isinstance(slugs, list | tuple) or not all(isinstance(s, str) for s in slugs):
        raise InvalidRequest("datasources must be a list of datasource slugs.")
    wanted = list(dict.fromkeys(slugs))
    known = set(datasources_for_user(user).filter(slug__in=wanted).values_list("slug", flat=True))
    unknown = [slug for slug in wanted if slug not in known]
    if unknown:
        raise InvalidRequest(
            f"Unknown or disabled datasource(s): {', '.join(unknown)}. "
            "GET /api/datasources lists the available ones.",
            code="unknown_datasource",
            extra={"slugs": unknown},
        )
    return wanted


@dataclass(frozen=True)
class KeptDatasources:
    """A conversation's kept datasources at a run's start: ``usable`` (enabled, and
    ``user`` may use them), ``lost`` (enabled, but ``user`` may no longer use them: a team
    left, an access rule changed), each in the conversation's order. Disabled or deleted
    ones are in neither."""

    usable: list[str]
    lost: list[str]


def datasources_kept(*, slugs: list[str], user: User | None) -> KeptDatasources:
    """Split a conversation's default datasources (``slugs``) for a run of ``user``: an
    operator may have disabled or deleted one since (left out quietly, as before), or
    ``user`` may have lost access to one (left out, and the run says so: ``run_start``)."""
    wanted = list(dict.fromkeys(slugs))
    usable = set(datasources_for_user(user).filter(slug__in=wanted).values_list("slug", flat=True))
    enabled = set(datasource_list().filter(slug__in=wanted).values_list("slug", flat=True))
    return KeptDatasources(
        usable=[slug for slug in wanted if slug in usable],
        lost=[slug for slug in wanted if slug in enabled and slug not in usable],
    )


def datasources_available(*, slugs: list[str], user: User | None) -> list[str]:
    """The slugs among ``slugs`` that name enabled datasources ``user`` may use, in the
    order given (a conversation's default datasources, one of which an operator may have
    disabled or deleted since: a run goes on with the others)."""
    return datasources_kept(slugs=slugs, user=user).usable


#: The fields of a team credential a caller sets (``team``: a team id; ``user``: the
#: database user, ``DatasourceCredential.db_user``).
CREDENTIAL_FIELDS = ("team", "user", "password", "priority")


def datasource_credential_create(*, datasource: Datasource, **fields: Any) -> DatasourceCredential:
    """Give team ``fields["team"]`` (an id) its own database ``user`` and ``password`` (a
    ``{secret:NAME}`` placeholder, or empty) on ``datasource``, at ``priority`` (default
    0). Checked as :func:`datasource_credential_save` says; :class:`Conflict`
    ``credential_exists`` when the team has its credentials there already."""
    unknown = set(fields) - set(CREDENTIAL_FIELDS)
    if unknown:
        raise InvalidRequest(f"Unknown field(s): {', '.join(sorted(unknown))}.")
    (team,) = _teams_of([fields.get("team")])
    credential = DatasourceCredential(
        datasource=datasource,
        team=team,
        db_user=fields.get("user", ""),
        password=fields.get("password", ""),
        priority=fields.get("priority", 0),
    )
    return datasource_credential_save(credential=credential)


def datasource_credential_update(
    *, credential: DatasourceCredential, **fields: Any
) -> DatasourceCredential:
    """Change the given fields of a team credential (those of
    :func:`datasource_credential_create`; ``team`` too)."""
    unknown = set(fields) - set(CREDENTIAL_FIELDS)
    if unknown:
        raise InvalidRequest(f"Unknown field(s): {', '.join(sorted(unknown))}.")
    if "team" in fields:
        (credential.team,) = _teams_of([fields["team"]])
    if "user" in fields:
        credential.db_user = fields["user"]
    if "password" in fields:
        credential.password = fields["password"]
    if "priority" in fields:
        credential.priority = fields["priority"]
    return datasource_credential_save(credential=credential)


def datasource_credential_save(*, credential: DatasourceCredential) -> DatasourceCredential:
    """Validate and save a team credential (the admin's inline and the REST edge alike).

    Raises :class:`InvalidRequest`: ``credentials_not_supported`` on an SQLite datasource,
    ``invalid_connection`` for a literal password (only ``{secret:NAME}``, as for the
    datasource's own) or a user that is not a string, ``datasource_user_privileged`` when
    the datasource is read-only and this user can do more than read (checked as the
    datasource's own user is, with the operator's global secrets; unchecked when the
    database cannot be reached now, and checked again at the datasource's next save);
    :class:`Conflict` ``credential_exists`` for a second credential of one team."""
    datasource = credential.datasource
    if datasource.dialect == Datasource.Dialect.SQLITE:
        raise InvalidRequest(
            "An SQLite datasource has no database users: team credentials are for "
            "PostgreSQL and MySQL datasources.",
            code="credentials_not_supported",
        )
    model_validate(credential, exclude=["datasource", "team"])
    datasource_privileges_enforce(datasource=datasource, credential=credential)
    taken = Conflict(
        f"Team {credential.team.name!r} has its credentials on '{datasource.slug}' already: "
        "change those.",
        code="credential_exists",
    )
    if (
        DatasourceCredential.objects.filter(datasource=datasource, team=credential.team)
        .exclude(pk=credential.pk)
        .exists()
    ):
        raise taken
    try:
        with transaction.atomic():
            credential.save()
    except IntegrityError:
        raise taken from None
    logger.info("datasource %s: credentials of team %s saved", datasource.slug, credential.team_id)
    return credential


def datasource_credential_delete(*, credential: DatasourceCredential) -> None:
    """Delete a team credential: the team's next runs connect as the datasource's own user
    (or another of the person's teams' credentials)."""
    credential.delete()
    logger.info(
        "datasource %s: credentials of team %s deleted",
        credential.datasource.slug,
        credential.team_id,
    )


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


def datasource_resolve(
    *, datasource: Datasource, user: User | None, credential: DatasourceCredential | None = None
) -> Resolved:
    """A datasource's connection settings with their placeholders resolved, checked; with
    ``credential`` (a team's, :func:`~secrets_vault.selectors.datasource_credential_for`),
    its user and password in place of the datasource's own.

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
    if credential is not None:
        connection = credential.connection_for(connection)
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


def datasource_connection(
    *, datasource: Datasource, user: User | None, credential: DatasourceCredential | None = None
) -> DatasourceConnection:
    """Resolve a datasource's placeholders for ``user`` (:func:`datasource_resolve`; with
    ``credential``, a team's user and password) and build its URL.

    Raises :class:`InvalidRequest` as :func:`datasource_resolve` (prefixed with the
    datasource's slug)."""
    resolved = datasource_resolve(datasource=datasource, user=user, credential=credential)
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
    *, datasource: Datasource, user: User | None, credential: DatasourceCredential | None = None
) -> tuple[dict[str, Any], dict[str, str]]:
    """The datasource's connection settings resolved and checked for ``user``
    (:func:`datasource_resolve`; with ``credential``, a team's user and password), and the
    values to mask in anything a driver says about it (``NAME`` and ``NAME:urlencoded`` →
    value). Raises :class:`InvalidRequest` as :func:`datasource_resolve`."""
    resolved = datasource_resolve(datasource=datasource, user=user, credential=credential)
    masked = dict(resolved.secret_values)
    for name, value in resolved.secret_values.items():
        masked[f"{name}:urlencoded"] = quote(value, safe="")
    return resolved.value, masked


def datasource_test(*, datasource: Datasource, user: User | None) -> ConnectionTestResult:
    """Really connect to the datasource (placeholders resolved for ``user``, e.g. the
    operator pressing "Test connection") and report the outcome: for a read-only
    PostgreSQL or MySQL datasource also what its user can do beyond reading (noted on the
    datasource; not ``ok`` when PAW would refuse to save it); then the same for each of
    its team credentials' users (``Team NAME (user): ...`` appended; not ``ok`` when one
    fails). Never raises for a connection or placeholder problem; the message never
    contains a secret value."""
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
    if datasource.pk is not None:
        for credential in datasource.credentials.select_related("team"):
            team_ok, team_message = _credential_test(datasource=datasource, credential=credential)
            ok = ok and team_ok
            message += f" Team {credential.team.name} ({credential.db_user}): {team_message}"
    return ConnectionTestResult(ok, message, privileges=result.privileges)


def _credential_test(
    *, datasource: Datasource, credential: DatasourceCredential
) -> tuple[bool, str]:
    """Connect as a team's user (its password resolved with the operator's global secrets)
    and note what it can do beyond reading on the credential: ``(ok, message)``, the
    message masked. Never raises for a connection or placeholder problem."""
    try:
        connection, masked = datasource_resolved(
            datasource=datasource, user=None, credential=credential
        )
    except DomainError as error:
        return False, error.detail
    result = connection_test(
        dialect=datasource.dialect, connection=connection, read_only=datasource.read_only
    )
    ok, message = result.ok, mask_text(result.message, masked)
    if result.privileges is not None:
        _privileges_record(datasource=credential, privileges=result.privileges)
        DatasourceCredential.objects.filter(pk=credential.pk).update(
            user_privileges=credential.user_privileges,
            privileges_checked_at=credential.privileges_checked_at,
        )
        if result.privileges.refused and not datasource.allow_privileged_user:
            ok = False
            message += " PAW refuses this user on a read-only datasource."
    return ok, message
