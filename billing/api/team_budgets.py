"""Staff-only REST for a team's monthly token budget (``/api/admin/teams/{id}/budget``):
thin edges over ``billing.services.team_budget_set`` and the budget selectors."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from billing.api.usage import TeamBudgetOutput
from billing.selectors import team_budget_get, team_budget_status
from billing.services import team_budget_set
from paw_project.adminkit import operator_write_log
from paw_project.api import StrictSerializer, error_responses
from paw_project.errors import NotFound
from teams.selectors import team_get


def _team_or_404(team_id: int):
    team = team_get(team_id)
    if team is None:
        raise NotFound("No such team.", code="team_not_found")
    return team


class AdminTeamBudgetApi(APIView):
    """``GET /api/admin/teams/{id}/budget``: the team's monthly budget and its month
    (``{id, name, monthly_limit, used_this_month, resets_at}``); ``PUT``
    ``{monthly_tokens}`` sets it (tokens per calendar month, UTC; 0 = unlimited)."""

    permission_classes = (IsAdminUser,)

    class InputSerializer(StrictSerializer):
        monthly_tokens = serializers.IntegerField(
            min_value=0,
            help_text="Tokens (input + output) per calendar month (UTC) over the members' "
            "runs; 0 = unlimited.",
        )

    @extend_schema(
        operation_id="admin_team_budget_retrieve",
        responses={200: TeamBudgetOutput, **error_responses(403, 404)},
    )
    def get(self, request: Request, team_id: int) -> Response:
        team = _team_or_404(team_id)
        status = team_budget_status(
            team_id=team.pk, name=team.name, limit=team_budget_get(team_id=team.pk)
        )
        return Response(TeamBudgetOutput(status).data)

    @extend_schema(
        operation_id="admin_team_budget_update",
        request=InputSerializer,
        responses={200: TeamBudgetOutput, **error_responses(400, 403, 404)},
    )
    def put(self, request: Request, team_id: int) -> Response:
        team = _team_or_404(team_id)
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        with transaction.atomic():
            budget = team_budget_set(team_id=team.pk, **data.validated_data)
            operator_write_log(
                request=request, obj=budget, action="change", fields=["monthly_tokens"]
            )
        status = team_budget_status(team_id=team.pk, name=team.name, limit=budget.monthly_tokens)
        return Response(TeamBudgetOutput(status).data)
