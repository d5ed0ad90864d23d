"""Usage API: a user's token usage over a date range, and where they stand against their
budgets."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.selectors import usage_report, usage_subject
from paw_project.api import error_responses


class UsageSums(serializers.Serializer):
    input_tokens = serializers.IntegerField()
    output_tokens = serializers.IntegerField()
    tokens = serializers.IntegerField(help_text="Input + output tokens.")
    rounds = serializers.IntegerField(help_text="Model calls.")
    runs = serializers.IntegerField(help_text="Finished runs (done, error or cancelled).")


class UsageDay(UsageSums):
    date = serializers.DateField(help_text="A day in UTC.")


class UsageConversation(UsageSums):
    conversation_id = serializers.UUIDField(
        allow_null=True, help_text="`null`: conversations deleted since."
    )
    title = serializers.CharField()


class UsageModel(UsageSums):
    provider = serializers.CharField()
    model = serializers.CharField()


class TeamBudgetOutput(serializers.Serializer):
    id = serializers.IntegerField(help_text="The team's id.")
    name = serializers.CharField()
    monthly_limit = serializers.IntegerField(
        help_text="Tokens per calendar month (UTC) over its members' runs; 0 = unlimited."
    )
    used_this_month = serializers.IntegerField(
        help_text="Tokens its members' runs used since the month began, while members."
    )
    resets_at = serializers.DateTimeField(help_text="When the month ends (UTC).")


class BudgetOutput(serializers.Serializer):
    monthly_limit = serializers.IntegerField(
        help_text="Tokens per calendar month (UTC); 0 = unlimited."
    )
    used_this_month = serializers.IntegerField(help_text="Tokens used since the month began.")
    resets_at = serializers.DateTimeField(help_text="When the month ends (UTC).")
    run_limit = serializers.IntegerField(help_text="Tokens per run; 0 = unlimited.")
    teams = TeamBudgetOutput(
        many=True, help_text="The budgets of the person's teams that have one, by name."
    )


class UsageUser(serializers.Serializer):
    id = serializers.IntegerField()
    username = serializers.CharField()


class UsageApi(APIView):
    """``GET /api/usage?from=YYYY-MM-DD&to=YYYY-MM-DD[&user=<username or id>]``."""

    class QuerySerializer(serializers.Serializer):
        class Meta:
            ref_name = "UsageQuery"

        vars()["from"] = serializers.DateField(
            required=False,
            input_formats=["%Y-%m-%d"],
            help_text="First day (UTC), included. Default: the first day of `to`'s month.",
        )
        to = serializers.DateField(
            required=False,
            input_formats=["%Y-%m-%d"],
            help_text="Last day (UTC), included. Default: today.",
        )
        user = serializers.CharField(
            required=False,
            max_length=150,
            help_text="Staff only: whose usage (a username or a user id).",
        )

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "UsageReport"

        user = UsageUser()
        vars()["from"] = serializers.DateField()
        to = serializers.DateField()
        totals = UsageSums()
        daily = UsageDay(many=True, help_text="Every day of the range, zeros included.")
        by_conversation = UsageConversation(many=True, help_text="Most tokens first.")
        by_model = UsageModel(many=True, help_text="Most tokens first.")
        budget = BudgetOutput()

    @extend_schema(
        operation_id="usage_retrieve",
        parameters=[QuerySerializer],
        responses={200: OutputSerializer, **error_responses(400, 403, 404)},
        summary="Token usage and budget",
    )
    def get(self, request: Request) -> Response:
        """Token usage (input + output tokens) over whole UTC days `from`..`to` (both
        included, at most 366 days): totals, a daily series, breakdowns by
        conversation and by model, and the budget. 400 `invalid_range` when `from` is
        after `to` or the range is too long; 403 when a non-staff user names another
        user; 404 for an unknown user (staff)."""
        query = self.QuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        params = query.validated_data
        subject = usage_subject(requester=request.user, user=params.get("user"))
        report = usage_report(user=subject, date_from=params.get("from"), date_to=params.get("to"))
        return Response(self.OutputSerializer(report).data)
