"""Staff-only REST for teams (``/api/admin/teams``): thin edges over ``teams.services``."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from paw_project.adminkit import operator_write_log
from paw_project.api import StrictSerializer, error_responses, list_output
from paw_project.errors import NotFound
from teams import selectors, services
from teams.models import Team

#: The most members one request may set (bounded work per request).
MEMBERS_MAX = 10_000


class TeamOutput(serializers.Serializer):
    """A team: its id, name and members' usernames (sorted)."""

    id = serializers.IntegerField()
    name = serializers.CharField()
    members = serializers.SerializerMethodField()

    def get_members(self, team: Team) -> list[str]:
        return sorted(user.username for user in team.user_set.all())


class TeamBriefOutput(serializers.Serializer):
    """A team as a member sees it: id and name."""

    id = serializers.IntegerField()
    name = serializers.CharField()


class TeamInput(StrictSerializer):
    """A team's fields; ``partial=True`` for PATCH."""

    name = serializers.CharField(max_length=services.TEAM_NAME_MAX_LENGTH)
    members = serializers.ListField(
        child=serializers.CharField(max_length=150),
        required=False,
        max_length=MEMBERS_MAX,
        help_text="Usernames: the whole membership (PATCH replaces it).",
    )


def _team_or_404(team_id: int) -> Team:
    team = selectors.team_get(team_id)
    if team is None:
        raise NotFound("No such team.", code="team_not_found")
    return team


class AdminTeamListApi(APIView):
    """``GET /api/admin/teams``: every team with its members; ``POST`` ``{name,
    members?}`` creates one (201; 400 ``unknown_user``; 409 ``team_name_taken``)."""

    permission_classes = (IsAdminUser,)
    OutputSerializer = list_output(key="teams", item=TeamOutput, ref_name="AdminTeamListOutput")

    @extend_schema(
        operation_id="admin_teams_list",
        responses={200: OutputSerializer, **error_responses(403)},
    )
    def get(self, request: Request) -> Response:
        return Response(self.OutputSerializer({"teams": selectors.team_list()}).data)

    @extend_schema(
        operation_id="admin_teams_create",
        request=TeamInput,
        responses={201: TeamOutput, **error_responses(400, 403, 409)},
    )
    def post(self, request: Request) -> Response:
        data = TeamInput(data=request.data)
        data.is_valid(raise_exception=True)
        team = services.team_create(**data.validated_data)
        operator_write_log(request=request, obj=team, action="add")
        return Response(TeamOutput(_team_or_404(team.pk)).data, status=status.HTTP_201_CREATED)


class AdminTeamDetailApi(APIView):
    """``GET /api/admin/teams/{id}``; ``PATCH`` ``{name?, members?}`` (members: the whole
    list); ``DELETE`` (204; the members keep their accounts)."""

    permission_classes = (IsAdminUser,)

    @extend_schema(
        operation_id="admin_teams_retrieve",
        responses={200: TeamOutput, **error_responses(403, 404)},
    )
    def get(self, request: Request, team_id: int) -> Response:
        return Response(TeamOutput(_team_or_404(team_id)).data)

    @extend_schema(
        operation_id="admin_teams_update",
        request=TeamInput,
        responses={200: TeamOutput, **error_responses(400, 403, 404, 409)},
    )
    def patch(self, request: Request, team_id: int) -> Response:
        team = _team_or_404(team_id)
        data = TeamInput(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        services.team_update(team=team, **data.validated_data)
        operator_write_log(
            request=request, obj=team, action="change", fields=sorted(data.validated_data)
        )
        return Response(TeamOutput(_team_or_404(team_id)).data)

    @extend_schema(
        operation_id="admin_teams_destroy",
        responses={204: None, **error_responses(403, 404)},
    )
    def delete(self, request: Request, team_id: int) -> Response:
        team = _team_or_404(team_id)
        with transaction.atomic():
            operator_write_log(request=request, obj=team, action="delete")
            services.team_delete(team=team)
        return Response(status=status.HTTP_204_NO_CONTENT)
