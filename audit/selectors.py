"""Reads of the audit: the SQL statements recorded, filtered as the admin and the staff
API ask."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet

from audit.models import SqlStatement, SqlStatementTeam


def _an_id(text: str, *, bits: int) -> int | None:
    """``text`` as a row id that fits a signed ``bits``-bit column (ASCII digits only),
    else ``None``."""
    if text.isascii() and text.isdigit() and int(text) < 2 ** (bits - 1):
        return int(text)
    return None


def sql_statements_filter(
    rows: QuerySet[SqlStatement],
    *,
    user: str | None = None,
    team: str | None = None,
    datasource: str | None = None,
    since: datetime.datetime | None = None,
    until: datetime.datetime | None = None,
) -> QuerySet[SqlStatement]:
    """``rows`` narrowed by each filter given: ``user`` a username or a user id (as
    recorded: a user deleted since is still found by name), ``team`` a team's id or name
    (as recorded: the user was in it at the time), ``datasource`` a slug, ``since`` and
    ``until`` aware datetimes, both included."""
    if user:
        match = Q(username=user)
        user_id = _an_id(user, bits=64)
        if user_id is not None:
            match |= Q(user_id=user_id)
        rows = rows.filter(match)
    if team:
        team_id = _an_id(team, bits=32)
        match = Q(team_id=team_id) if team_id is not None else Q(name=team)
        rows = rows.filter(
            Exists(SqlStatementTeam.objects.filter(match, statement_id=OuterRef("pk")))
        )
    if datasource:
        rows = rows.filter(datasource=datasource)
    if since is not None:
        rows = rows.filter(time__gte=since)
    if until is not None:
        rows = rows.filter(time__lte=until)
    return rows


def sql_statement_list(**filters: Any) -> QuerySet[SqlStatement]:
    """The recorded statements, newest first (``time``, then ``id``), with their teams
    prefetched, narrowed by ``filters`` (those of :func:`sql_statements_filter`)."""
    rows = sql_statements_filter(SqlStatement.objects.all(), **filters)
    return rows.order_by("-time", "-id").prefetch_related("teams")


def sql_statement_recorded(*, run_id: uuid.UUID, ordinal: int) -> bool:
    """Whether the ``ordinal``-th statement of run ``run_id`` is recorded already."""
    return SqlStatement.objects.filter(run_id=run_id, ordinal=ordinal).exists()


def approval_ids_recorded(*, run_id: uuid.UUID) -> set[uuid.UUID]:
    """The approvals the recorded statements of run ``run_id`` name (each confirm allows
    one statement, so one already named is not another's)."""
    return set(
        SqlStatement.objects.filter(run_id=run_id, approval_id__isnull=False).values_list(
            "approval_id", flat=True
        )
    )
