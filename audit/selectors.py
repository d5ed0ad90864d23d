"""Reads of the audit: the SQL statements recorded, filtered as the admin and the staff
API ask."""

from __future__ import annotations

import datetime
import unicodedata
import uuid
from typing import Any

from django.db.models import Exists, OuterRef, QuerySet

from audit.models import SqlStatement, SqlStatementTeam

#: The largest ids a filter may name: ``user_id`` (a 64-bit column), ``team_id`` (32-bit).
USER_ID_MAX = 2**63 - 1
TEAM_ID_MAX = 2**31 - 1


def sql_statements_filter(
    rows: QuerySet[SqlStatement],
    *,
    user: str | None = None,
    user_id: int | None = None,
    team: str | None = None,
    team_id: int | None = None,
    datasource: str | None = None,
    since: datetime.datetime | None = None,
    until: datetime.datetime | None = None,
) -> QuerySet[SqlStatement]:
    """``rows`` narrowed by each filter given. One rule, no guessing from the text: a
    name is a name and an id an id — ``user`` a username (exactly, as recorded: a user
    deleted since is still found), ``user_id`` a user's id, ``team`` a team's name as
    recorded (NFC, ignoring case — team names are unique ignoring case; a team named
    ``2024`` is found by that name), ``team_id`` a team's id (the user was in it at the
    time), ``datasource`` a slug, ``since`` and ``until`` aware datetimes, both included.
    (Ignoring case is the database's ``iexact``: all of Unicode on PostgreSQL, ASCII on
    SQLite.)"""
    if user:
        rows = rows.filter(username=user)
    if user_id is not None:
        rows = rows.filter(user_id=user_id)
    if team:
        name = unicodedata.normalize("NFC", team).strip()
        rows = rows.filter(
            Exists(SqlStatementTeam.objects.filter(name__iexact=name, statement_id=OuterRef("pk")))
        )
    if team_id is not None:
        rows = rows.filter(
            Exists(SqlStatementTeam.objects.filter(team_id=team_id, statement_id=OuterRef("pk")))
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


def sql_statements_of_run(*, run_id: uuid.UUID) -> list[tuple[str, str, str]]:
    """The statements run ``run_id`` sent, in its order: ``(datasource slug, statement
    as stored (masked), outcome)`` each."""
    return list(
        SqlStatement.objects.filter(run_id=run_id)
        .order_by("ordinal")
        .values_list("datasource", "statement", "outcome")
    )
