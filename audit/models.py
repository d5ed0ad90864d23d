"""The audit's rows: one :class:`SqlStatement` per SQL statement a run sent to a
datasource, with the teams its user was in (:class:`SqlStatementTeam`).

Append only: rows are written by the node's event pipeline (``audit.services``), never
changed, and removed only by the retention task (``PAW_AUDIT_RETENTION_DAYS``). They
outlive what they name: a conversation, run, datasource, team or user deleted later keeps
its rows (ids and names are copied, not foreign keys that would cascade).
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class SqlStatement(models.Model):
    """One SQL statement a run sent (or tried to send) to a datasource.

    ``time``: when the node read the runtime's announcement of the call (the statement
    was sent right after; UTC). ``ordinal``: the statement's place among its run's
    ``run_sql`` calls (1, 2 …, counted by the node), which with ``run_id`` makes a row
    unique, so a batch stored again (a retried transaction) records nothing twice.
    ``statement``: as masked for storage (a secret's value is ``[secret:NAME]``).
    ``kind``: ``read`` or ``write``, judged by PAW (``paw_sqlcheck``, the rule ``run_sql``
    applies) on the datasource's dialect. ``approval_id``: the confirm that named the call
    (a write), approved or not; ``approved_by``, ``approved_via``: who approved it and how
    (``user``: that person; ``auto``: the conversation's auto-approve, ``approved_by``
    then its owner), empty when nobody did. ``outcome``: ``ok``, or an error code (``database_error``,
    ``timeout``, ``connect_failed``, ``declined``, ``refused``, ``check_failed``,
    ``interrupted`` …: docs/data.md). ``explained``: paw-agent's check before running sent
    an ``EXPLAIN`` of the statement to the datasource first (the row stands for both; with
    ``check_failed`` only the ``EXPLAIN`` was sent). ``row_count``: rows returned (a read,
    counted up to 100,000) or changed (a write), ``None`` when unknown. ``duration_ms``:
    how long the statement took, as the runtime timed it (milliseconds), ``None`` when
    unknown.
    """

    class Kind(models.TextChoices):
        READ = "read"
        WRITE = "write"

    id = models.BigAutoField(primary_key=True)
    time = models.DateTimeField(db_index=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    username = models.CharField(max_length=150, db_index=True)
    datasource = models.CharField(max_length=100, db_index=True, help_text="Its slug.")
    conversation_id = models.UUIDField(db_index=True)
    run_id = models.UUIDField()
    ordinal = models.PositiveIntegerField()
    statement = models.TextField()
    kind = models.CharField(max_length=8, choices=Kind.choices)
    approval_id = models.UUIDField(null=True, blank=True)
    approved_by = models.CharField(max_length=150, blank=True, default="")
    approved_via = models.CharField(max_length=16, blank=True, default="")
    outcome = models.CharField(max_length=64)
    explained = models.BooleanField(
        default=False, help_text="An EXPLAIN of it was sent first (paw-agent's check)."
    )
    row_count = models.BigIntegerField(null=True, blank=True)
    duration_ms = models.BigIntegerField(null=True, blank=True)

    class Meta:
        ordering = ("-time", "-id")
        verbose_name = "SQL statement"
        constraints = [
            models.UniqueConstraint(fields=["run_id", "ordinal"], name="audit_statement_once")
        ]

    def __str__(self) -> str:
        return (
            f"{self.kind} on {self.datasource} by {self.username} at {self.time:%Y-%m-%d %H:%M:%S}"
        )


class SqlStatementTeam(models.Model):
    """A team the statement's user was a member of when it was recorded: the team's id
    (``auth.Group``) and name, copied (the team may be renamed or deleted later)."""

    statement = models.ForeignKey(SqlStatement, on_delete=models.CASCADE, related_name="teams")
    team_id = models.IntegerField(db_index=True)
    name = models.CharField(max_length=150)

    class Meta:
        ordering = ("name",)
        verbose_name = "team of a SQL statement"

    def __str__(self) -> str:
        return self.name
