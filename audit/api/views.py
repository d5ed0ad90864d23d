"""``GET /api/admin/audit``: the SQL statements runs sent, for staff, newest first,
cursor-paginated, with filters."""

from __future__ import annotations

import datetime
import re
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.selectors import sql_statement_list
from paw_project.api import (
    PawCursorPagination,
    StrictSerializer,
    error_responses,
    paginated_response,
)
from paw_project.errors import InvalidRequest

_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class AuditPagination(PawCursorPagination):
    """Newest first: by ``time``, ties by the newest row."""

    ordering = ("-time", "-id")


class AuditTeamOutput(serializers.Serializer):
    id = serializers.IntegerField(source="team_id", help_text="The team's id (at the time).")
    name = serializers.CharField(help_text="Its name at the time.")


class AuditStatementOutput(serializers.Serializer):
    """One SQL statement a run sent to a datasource."""

    id = serializers.IntegerField()
    time = serializers.DateTimeField(help_text="When the node read the call's announcement.")
    user = serializers.CharField(source="username", help_text="The run's user (username).")
    user_id = serializers.IntegerField(
        allow_null=True, help_text="Their id; `null` when the account was deleted since."
    )
    teams = AuditTeamOutput(many=True, help_text="The teams the user was in at the time.")
    datasource = serializers.CharField(help_text="The datasource's slug.")
    conversation_id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    statement = serializers.CharField(help_text="The statement, masked (`[secret:NAME]`).")
    kind = serializers.ChoiceField(
        choices=("read", "write"), help_text="Judged by PAW's rule of a read (`paw_sqlcheck`)."
    )
    approved_by = serializers.CharField(
        allow_null=True, help_text="Who approved the write (username), else `null`."
    )
    approved_via = serializers.CharField(
        allow_null=True,
        help_text="`user` (that person) or `auto` (the conversation's auto-approve, by its "
        "owner), else `null`.",
    )
    approval_id = serializers.UUIDField(
        allow_null=True, help_text="The confirm that named the call (approved or not), else `null`."
    )
    outcome = serializers.CharField(
        help_text="`ok`, or an error code: `database_error`, `timeout`, `connect_failed`, "
        "`declined`, `refused`, `interrupted` …"
    )
    row_count = serializers.IntegerField(
        allow_null=True, help_text="Rows returned (a read) or changed (a write); `null`: unknown."
    )
    duration_ms = serializers.IntegerField(
        allow_null=True, help_text="Milliseconds, as the runtime timed the statement."
    )

    def to_representation(self, instance: Any) -> dict[str, Any]:
        data = super().to_representation(instance)
        for key in ("approved_by", "approved_via"):
            data[key] = data[key] or None
        return data


class _Moment(serializers.DateTimeField):
    """An ISO 8601 datetime (UTC when it names no offset) or a date alone, which
    ``end_of_day`` reads as the last moment of that day (UTC) and otherwise as its
    start."""

    def __init__(self, *, end_of_day: bool = False, **kwargs: Any) -> None:
        self.end_of_day = end_of_day
        super().__init__(**kwargs)

    def to_internal_value(self, value: Any) -> datetime.datetime:
        moment = super().to_internal_value(value)
        if self.end_of_day and isinstance(value, str) and _DATE_ONLY.match(value.strip()):
            moment += datetime.timedelta(days=1, microseconds=-1)
        return moment


class AuditListApi(APIView):
    """``GET /api/admin/audit?user=&team=&datasource=&since=&until=`` (staff)."""

    permission_classes = (IsAdminUser,)
    pagination_class = AuditPagination
    #: Query parameters of the pagination, beside the filters.
    PAGING = ("cursor", "page_size")

    class QuerySerializer(StrictSerializer):
        class Meta:
            ref_name = "AuditQuery"

        user = serializers.CharField(
            required=False, max_length=150, help_text="A username or a user id."
        )
        team = serializers.CharField(
            required=False, max_length=150,
            help_text="A team's id or name (the teams its user was in at the time).",
        )  # fmt: skip
        datasource = serializers.CharField(
            required=False, max_length=100, help_text="A datasource's slug."
        )
        since = _Moment(
            required=False,
            help_text="From this moment on (ISO 8601; a date alone: its start, UTC).",
        )
        until = _Moment(
            required=False,
            end_of_day=True,
            help_text="Up to this moment (ISO 8601; a date alone: the whole day, UTC).",
        )

        def to_internal_value(self, data: Any) -> Any:
            filters = {key: data.get(key) for key in data if key not in AuditListApi.PAGING}
            return super().to_internal_value(filters)

    @extend_schema(
        operation_id="admin_audit_list",
        parameters=[QuerySerializer],
        responses={200: AuditStatementOutput(many=True), **error_responses(400, 403, 404)},
        summary="The audit of SQL statements (staff)",
    )
    def get(self, request: Request) -> Response:
        """Every SQL statement runs sent to datasources, newest first, cursor-paginated
        (follow `next`). Filters: `user` (username or id), `team` (id or name, as the
        user's teams were then), `datasource` (slug), `since` and `until` (ISO 8601, both
        included; a date alone is that whole day, UTC). 400 for a malformed filter
        (`invalid`), an unknown parameter (`unknown_field`) or `since` after `until`
        (`invalid_range`)."""
        query = self.QuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        filters = query.validated_data
        since, until = filters.get("since"), filters.get("until")
        if since is not None and until is not None and since > until:
            raise InvalidRequest("`since` is after `until`.", code="invalid_range")
        return paginated_response(
            request=request,
            view=self,
            queryset=sql_statement_list(**filters),
            serializer_class=AuditStatementOutput,
            pagination_class=AuditPagination,
        )
