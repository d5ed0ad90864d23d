"""Writes of datasources, their validation for runs, URLs and connection tests."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from django.db import IntegrityError, transaction

from paw_project.errors import Conflict, DomainError, InvalidRequest
from secrets_vault.connections import ConnectionTestResult, connection_test, connection_url
from secrets_vault.masking import mask_text, secret_values_register
from secrets_vault.models import Datasource
from secrets_vault.services.secrets import model_validate, placeholders_resolve

if TYPE_CHECKING:
    from accounts.models import User

logger = logging.getLogger(__name__)

DATASOURCE_FIELDS = ("slug", "name", "description", "dialect", "connection", "read_only", "enabled")


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


def datasource_save(*, datasource: Datasource) -> Datasource:
    """Validate and save a datasource (the admin's edge; see :func:`datasource_create`)."""
    model_validate(datasource)
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


def datasource_connection(*, datasource: Datasource, user: User | None) -> DatasourceConnection:
    """Resolve a datasource's placeholders for ``user`` and build its URL.

    Raises :class:`InvalidRequest` naming a missing or undecryptable secret (prefixed
    with the datasource's slug)."""
    try:
        resolved = placeholders_resolve(user=user, obj=datasource.connection)
    except InvalidRequest as error:
        raise InvalidRequest(
            f"Datasource '{datasource.slug}': {error.detail}", code=error.code, extra=error.extra
        ) from None
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


def datasource_test(*, datasource: Datasource, user: User | None) -> ConnectionTestResult:
    """Really connect to the datasource (placeholders resolved for ``user``, e.g. the
    operator pressing "Test connection") and report the outcome. Never raises for a
    connection or placeholder problem; the message never contains a secret value."""
    try:
        resolved = placeholders_resolve(user=user, obj=datasource.connection)
    except DomainError as error:
        return ConnectionTestResult(False, error.detail)
    result = connection_test(
        dialect=datasource.dialect, connection=resolved.value, read_only=datasource.read_only
    )
    masked = dict(resolved.secret_values)
    for name, value in resolved.secret_values.items():
        masked[f"{name}:urlencoded"] = quote(value, safe="")
    logger.info(
        "datasource %s connection test: %s", datasource.slug, "ok" if result.ok else "failed"
    )
    return ConnectionTestResult(result.ok, mask_text(result.message, masked))
