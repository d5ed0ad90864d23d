"""``GET /api/admin/audit``: the SQL statements runs sent, for staff, newest first,
cursor-paginated, with filters."""

from __future__ import annotations

import base64
import binascii
import datetime
import re
from typing import Any

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from audit.selectors import TEAM_ID_MAX, USER_ID_MAX, sql_statement_list
from paw_project.api import (
    PawCursorPagination,
    StrictSerializer,
    error_responses,
    paginated_response,
)
from paw_project.errors import InvalidRequest

_DATE_ONLY = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class _Id(serializers.IntegerField):
    """A row id: ASCII digits only (``int()`` would read ``٣`` as 3)."""

    def to_internal_value(self, data: Any) -> int:
        if isinstance(data, str) and not (data.isascii() and data.strip().isdigit()):
            self.fail("invalid")
        return super().to_internal_value(data)


class AuditPagination(PawCursorPagination):
    """Newest first: by ``time``, ties by the newest row. Stricter than the other lists:
    a ``cursor`` that is not one of ``next``/``previous`` is 400 ``invalid_cursor`` (not
    DRF's 404: nothing is missing, the request is wrong), and a ``page_size`` that is
    not a whole number from 1 to :attr:`max_page_size` is 400 ``invalid_page_size``
    (not silently the default or the maximum)."""

    ordering = ("-time", "-id")

    def get_page_size(self, request: Request) -> int:
        raw = request.query_params.get(self.page_size_query_param)
        if raw is None:
            return self.page_size
        text = raw.strip()
        if not (text.isascii() and text.isdigit() and 1 <= int(text) <= self.max_page_size):
            raise InvalidRequest(
                f"`page_size` is a whole number from 1 to {self.max_page_size}.",
                code="invalid_page_size",
            )
        return int(text)

    def decode_cursor(self, request: Request) -> Any:
        """DRF's cursor, checked further: strict base64 (DRF drops the characters outside
        it, reading ``!!!`` as the first page) and a position that is a moment (a
        position ``2026`` would reach the database as a time and fail there)."""
        invalid = InvalidRequest(
            "`cursor` is not one this list gave (follow `next` or `previous`).",
            code="invalid_cursor",
        )
        raw = request.query_params.get(self.cursor_query_param)
        if raw is None:
            return None
        try:
            base64.b64decode(raw.encode("ascii"), validate=True)
            cursor = super().decode_cursor(request)
            if cursor is not None and cursor.position is not None:
                datetime.datetime.fromisoformat(cursor.position)
        except (NotFound, ValueError, binascii.Error, UnicodeEncodeError) as error:
            raise invalid from error
        return cursor


class AuditTeamOutput(serializers.Serializer):
    id = serializers.IntegerField(source="team_id", help_text="The team's id (at the time).")
    name = serializers.CharField(help_text="Its name at the time.")


class AuditStatementOutput(serializers.Serializer):
    """One SQL statement a run sent to a datasource."""

    id = serializers.IntegerField()
    time = serializers.DateTimeField(help_text="When the node read the call's announcement.")
    user = serializers.CharField(source="username", help_text="The run's user (username).")
    user_id = _Id(allow_null=True, help_text="Their id; `null` when the account was deleted since.")
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
        "`declined`, `refused`, `check_failed`, `interrupted` …"
    )
    explained = serializers.BooleanField(
        help_text="paw-agent's check sent an EXPLAIN of it first (with `check_failed`, only "
        "the EXPLAIN was sent)."
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
    """``GET /api/admin/audit?user=&user_id=&team=&team_id=&datasource=&since=&until=``
    (staff)."""

    permission_classes = (IsAdminUser,)
    pagination_class = AuditPagination
    #: Query parameters of the pagination, beside the filters.
    PAGING = ("cursor", "page_size")

    class QuerySerializer(StrictSerializer):
        class Meta:
            ref_name = "AuditQuery"

        user = serializers.CharField(
            required=False, max_length=150, help_text="A username (exactly; digits too)."
        )
        user_id = _Id(required=False, min_value=1, max_value=USER_ID_MAX, help_text="A user's id.")
        team = serializers.CharField(
            required=False, max_length=150,
            help_text="A team's name, ignoring case (digits too; the teams its user was in "
            "at the time, by the name they had then).",
        )  # fmt: skip
        team_id = _Id(
            required=False, min_value=1, max_value=TEAM_ID_MAX,
            help_text="A team's id (the teams its user was in at the time).",
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
            filters = data.copy()  # a QueryDict still: its strings coerced as a form's
            for key in AuditListApi.PAGING:
                filters.pop(key, None)
            return super().to_internal_value(filters)

    @extend_schema(
        operation_id="admin_audit_list",
        parameters=[QuerySerializer],
        responses={200: AuditStatementOutput(many=True), **error_responses(400, 403)},
        summary="The audit of SQL statements (staff)",
    )
    def get(self, request: Request) -> Response:
        """Every SQL statement runs sent to datasources, newest first, cursor-paginated
        (follow `next`; `page_size` 1 to 100). Filters: `user` (a username) or `user_id`
        (an id), `team` (a name, ignoring case) or `team_id` (an id) — the user's teams as
        they were then, `datasource` (slug), `since` and `until` (ISO 8601, both
        included; a date alone is that whole day, UTC). 400 for a malformed filter
        (`invalid`, `min_value`, `max_value`), an unknown parameter (`unknown_field`),
        `since` after `until` (`invalid_range`), a cursor not from `next`/`previous`
        (`invalid_cursor`) or a bad `page_size` (`invalid_page_size`)."""
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
