"""Writes of the audit: a SQL statement a run sent (called by the domain's run effects,
inside the node's transaction), and the retention (of those rows and of Django's admin
log, where operators' writes are: ``paw_project.adminkit.operator_write_log``).

Append only: nothing here changes a recorded row; :func:`audit_prune` removes rows older
than ``PAW_AUDIT_RETENTION_DAYS``.
"""

from __future__ import annotations

import datetime
import logging
import uuid

from django.conf import settings
from django.contrib.admin.models import LogEntry
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction
from django.utils import timezone

from audit.models import SqlStatement, SqlStatementTeam
from audit.selectors import sql_statement_recorded
from teams.selectors import user_teams

logger = logging.getLogger(__name__)

#: Most characters of a statement kept (a longer one is cut, and says so).
MAX_STATEMENT_CHARS = 100_000
#: Rows :func:`audit_prune` deletes per statement (short transactions on a large table).
PRUNE_CHUNK = 5000


def sql_statement_record(
    *,
    run_id: uuid.UUID,
    ordinal: int,
    time: datetime.datetime,
    user_id: int,
    conversation_id: uuid.UUID,
    datasource: str,
    dialect: str | None,
    statement: str,
    outcome: str,
    row_count: int | None = None,
    duration_ms: int | None = None,
    approval_id: uuid.UUID | None = None,
    approved_by: str = "",
    approved_via: str = "",
    explained: bool = False,
) -> SqlStatement | None:
    """Record the ``ordinal``-th SQL statement (1, 2 …) of run ``run_id``, sent at
    ``time`` by user ``user_id`` to datasource ``datasource`` (a slug), with the teams
    the user is in now (``teams.selectors.user_teams``: ids and names, copied). ``statement``
    is already masked; it is cut at :data:`MAX_STATEMENT_CHARS`. Its ``kind`` (``read``
    or ``write``) is judged here by ``paw_sqlcheck`` for ``dialect`` (``None``, a
    datasource PAW does not know: a ``write``, as anything not known to be a read).
    ``outcome``: ``ok`` or an error code; ``row_count`` and ``duration_ms``
    (milliseconds) as known, else ``None``; ``approval_id``, ``approved_by`` (a
    username) and ``approved_via`` (``user`` | ``auto``): the confirm that allowed it.
    ``explained``: an ``EXPLAIN`` of it was sent first (paw-agent's check before running).

    Returns the row, or ``None`` when that statement of the run is recorded already (a
    batch applied again records nothing twice). Call inside a transaction (the node's)."""
    if sql_statement_recorded(run_id=run_id, ordinal=ordinal):
        return None
    from paw_sqlcheck import judge  # sqlglot loads on the first statement

    read = dialect is not None and judge(statement, dialect=dialect).read
    if len(statement) > MAX_STATEMENT_CHARS:
        statement = statement[: MAX_STATEMENT_CHARS - 1] + "…"
    user = get_user_model().objects.filter(pk=user_id).first()
    try:
        with transaction.atomic():  # a savepoint: a lost race leaves the batch intact
            row = SqlStatement.objects.create(
                time=time,
                user_id=user.pk if user is not None else None,
                username=user.get_username() if user is not None else "",
                datasource=datasource[:100],
                conversation_id=conversation_id,
                run_id=run_id,
                ordinal=ordinal,
                statement=statement,
                kind=SqlStatement.Kind.READ if read else SqlStatement.Kind.WRITE,
                approval_id=approval_id,
                approved_by=approved_by[:150],
                approved_via=approved_via[:16],
                outcome=outcome[:64],
                explained=explained,
                row_count=row_count,
                duration_ms=duration_ms,
            )
    except IntegrityError:  # recorded meanwhile by another writer
        return None
    SqlStatementTeam.objects.bulk_create(
        SqlStatementTeam(statement=row, team_id=team.pk, name=team.name)
        for team in user_teams(user)
    )
    return row


def audit_prune(*, now: datetime.datetime | None = None) -> dict[str, int]:
    """Delete what is older than ``PAW_AUDIT_RETENTION_DAYS`` days (``0``: keep
    everything): recorded SQL statements (by ``time``) and entries of the admin log (by
    ``action_time``: operators' writes, in the admin and over REST). In chunks of
    :data:`PRUNE_CHUNK` rows. Returns ``{"statements": n, "log_entries": n}`` deleted."""
    days = settings.PAW_AUDIT_RETENTION_DAYS
    deleted = {"statements": 0, "log_entries": 0}
    if days <= 0:
        return deleted
    cutoff = (now or timezone.now()) - datetime.timedelta(days=days)
    for key, model, field in (
        ("statements", SqlStatement, "time"),
        ("log_entries", LogEntry, "action_time"),
    ):
        while True:
            ids = list(
                model.objects.filter(**{f"{field}__lt": cutoff}).values_list("pk", flat=True)[
                    :PRUNE_CHUNK
                ]
            )
            if not ids:
                break
            model.objects.filter(pk__in=ids).delete()
            deleted[key] += len(ids)
    if any(deleted.values()):
        logger.info(
            "audit: removed %d SQL statements and %d admin log entries older than %d days",
            deleted["statements"], deleted["log_entries"], days,
        )  # fmt: skip
    return deleted
