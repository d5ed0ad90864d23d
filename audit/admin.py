"""Admin: the audit of SQL statements, read-only, with filters (user, team, datasource,
date) and a CSV export (of the selected rows: an action; of every filtered row: *Export
as CSV* on the list, ``/admin/audit/sqlstatement/export.csv?<the list's filters>``).

The operators' own writes are in Django's admin log (``LogEntry``): the admin records
its writes there, and the REST operator views too (``paw_project.adminkit.operator_write_log``).
"""

from __future__ import annotations

import csv
import datetime
from collections.abc import Iterable, Iterator
from typing import Any

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import QuerySet
from django.http import (
    HttpRequest,
    HttpResponse,
    HttpResponseBadRequest,
    StreamingHttpResponse,
)
from django.urls import path
from django.utils import timezone

from audit.models import SqlStatement, SqlStatementTeam
from audit.selectors import TEAM_ID_MAX, sql_statements_filter
from paw_project.adminkit import PawModelAdmin

#: The CSV's columns, in order (the staff API's fields, teams as names joined by ``;``).
CSV_COLUMNS = (
    "time", "username", "teams", "datasource", "conversation_id", "run_id", "kind",
    "statement", "approved_by", "approved_via", "approval_id", "outcome", "explained",
    "row_count", "duration_ms",
)  # fmt: skip
#: A cell starting with one of these is read as a formula by spreadsheets: it gets a
#: leading ``'`` in the CSV (OWASP's advice on CSV injection).
_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def csv_cell(value: Any) -> str:
    """A value as a CSV cell: ``None`` empty, booleans ``true`` / ``false`` (as in the
    staff API's JSON), datetimes ISO 8601 in UTC, text that a spreadsheet would run as a
    formula (``=…``, ``+…``, ``-…``, ``@…``) behind a ``'``."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if hasattr(value, "isoformat"):
        return value.astimezone(datetime.UTC).isoformat().replace("+00:00", "Z")
    text = str(value)
    return "'" + text if text.startswith(_FORMULA_STARTS) else text


def csv_rows(statements: Iterable[SqlStatement]) -> Iterator[list[str]]:
    """The header, then one row of :data:`CSV_COLUMNS` per statement."""
    yield list(CSV_COLUMNS)
    for statement in statements:
        teams = "; ".join(team.name for team in statement.teams.all())
        yield [
            csv_cell(teams if column == "teams" else getattr(statement, column))
            for column in CSV_COLUMNS
        ]


class _Echo:
    """A file whose ``write`` returns what it was given (``csv.writer`` into a stream)."""

    def write(self, value: str) -> str:
        return value


def csv_response(statements: QuerySet[SqlStatement], *, filename: str) -> StreamingHttpResponse:
    """``statements`` as a CSV attachment named ``filename``, streamed (UTF-8, a row
    at a time, read in chunks)."""
    writer = csv.writer(_Echo())
    rows = csv_rows(statements.prefetch_related("teams").iterator(chunk_size=2000))
    response = StreamingHttpResponse(
        (writer.writerow(row) for row in rows), content_type="text/csv; charset=utf-8"
    )
    response["Content-Disposition"] = f'attachment; filename="{filename}"'
    return response


class TeamFilter(admin.SimpleListFilter):
    """The statements of users who were in a team at the time (teams as recorded)."""

    title = "team"
    parameter_name = "team"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        teams = (
            SqlStatementTeam.objects.order_by("name", "team_id")
            .values_list("team_id", "name")
            .distinct()
        )
        return [(str(team_id), name) for team_id, name in teams]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        value = self.value()
        if not value:
            return queryset
        ok = value.isascii() and value.isdigit() and int(value) <= TEAM_ID_MAX
        return sql_statements_filter(queryset, team_id=int(value) if ok else 0)  # 0: no team


class SqlStatementTeamInline(admin.TabularInline):
    model = SqlStatementTeam
    fields = ("team_id", "name")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(SqlStatement)
class SqlStatementAdmin(PawModelAdmin):
    """Every SQL statement runs sent: read-only (append only; rows leave only by
    ``PAW_AUDIT_RETENTION_DAYS``)."""

    list_display = (
        "time", "username", "team_names", "datasource", "kind", "short_statement",
        "approved_by", "outcome", "explained", "row_count", "duration_ms",
    )  # fmt: skip
    list_filter = (
        ("username", admin.AllValuesFieldListFilter),
        TeamFilter,
        ("datasource", admin.AllValuesFieldListFilter),
        ("time", admin.DateFieldListFilter),
        "kind",
        "outcome",
    )
    date_hierarchy = "time"
    search_fields = ("=run_id", "=conversation_id", "username", "statement")
    readonly_fields = [f.name for f in SqlStatement._meta.fields]
    inlines = (SqlStatementTeamInline,)
    actions = ("export_csv",)

    @admin.display(description="teams")
    def team_names(self, statement: SqlStatement) -> str:
        return ", ".join(team.name for team in statement.teams.all())

    @admin.display(description="statement")
    def short_statement(self, statement: SqlStatement) -> str:
        text = " ".join(statement.statement.split())
        return text if len(text) <= 120 else text[:119] + "…"

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).prefetch_related("teams")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        # Only the export: no delete_selected on an append-only audit.
        return {
            name: action for name, action in super().get_actions(request).items()
            if name == "export_csv"
        }  # fmt: skip

    @admin.action(description="Export selected statements as CSV", permissions=["view"])
    def export_csv(self, request: HttpRequest, queryset: QuerySet) -> StreamingHttpResponse:
        return csv_response(queryset, filename=_filename())

    def get_urls(self) -> list[Any]:
        export = path(
            "export.csv",
            self.admin_site.admin_view(self.export_view),
            name="audit_sqlstatement_export",
        )
        return [export, *super().get_urls()]

    def export_view(self, request: HttpRequest) -> HttpResponse:
        """Every statement of the list as filtered (and searched) by the query string, as
        a CSV attachment; 400 for filters the list does not know."""
        if not self.has_view_permission(request):
            return HttpResponse(status=403)
        try:
            changelist = self.get_changelist_instance(request)
        except IncorrectLookupParameters:
            return HttpResponseBadRequest("These filters do not apply to the audit.")
        return csv_response(changelist.get_queryset(request), filename=_filename())


def _filename() -> str:
    return f"paw-sql-audit-{timezone.now():%Y%m%d-%H%M%S}.csv"
