"""Staff-only REST for who may use which provider and model (``/api/admin/providers``):
thin edges over ``secrets_vault.services.provider_access``."""

from __future__ import annotations

from django.db import transaction
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.permissions import IsAdminUser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from paw_project.adminkit import operator_write_log
from paw_project.api import StrictSerializer, error_responses, list_output
from paw_project.errors import NotFound
from secrets_vault.selectors import ProviderAccessView, provider_access_list
from secrets_vault.services.provider_access import MODEL_LIMIT_MAX, provider_access_set
from teams.models import Access

#: The most teams one request may list (bounded work per request).
TEAMS_MAX = 1_000


class TeamRefOutput(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()


class ModelLimitOutput(serializers.Serializer):
    team = serializers.IntegerField(help_text="The team's id.")
    team_name = serializers.CharField()
    models = serializers.ListField(
        child=serializers.CharField(), help_text="The only models its members may use."
    )


class ProviderAccessOutput(serializers.Serializer):
    """A provider's access: everyone or the listed teams (staff always), and the teams
    limited to some of its models."""

    provider = serializers.CharField()
    label = serializers.CharField()
    known = serializers.BooleanField(
        help_text="Whether the provider exists now (false: the rule of a deleted custom "
        "provider, kept for a new one of that name)."
    )
    access = serializers.ChoiceField(choices=Access.choices)
    teams = TeamRefOutput(many=True)
    model_limits = ModelLimitOutput(many=True)

    def to_representation(self, view: ProviderAccessView) -> dict:
        return {
            "provider": view.provider,
            "label": view.label,
            "known": view.known,
            "access": view.access,
            "teams": [{"id": team_id, "name": name} for team_id, name in view.teams],
            "model_limits": [
                {"team": team_id, "team_name": name, "models": models}
                for team_id, name, models in view.model_limits
            ],
        }


class ModelLimitInput(StrictSerializer):
    team = serializers.IntegerField(help_text="A team's id.")
    models = serializers.ListField(
        child=serializers.CharField(max_length=200),
        min_length=1,
        max_length=MODEL_LIMIT_MAX,
        help_text="The only models of the provider the team's members may use.",
    )


class ProviderAccessInput(StrictSerializer):
    """What a PATCH changes (each field optional; lists are whole)."""

    access = serializers.ChoiceField(choices=Access.choices, required=False)
    teams = serializers.ListField(
        child=serializers.IntegerField(),
        required=False,
        max_length=TEAMS_MAX,
        help_text="Team ids: the whole list of teams that may use it (access `teams`).",
    )
    model_limits = ModelLimitInput(
        many=True,
        required=False,
        help_text="The whole list of model limits, one per team; `[]` removes them.",
    )


def _access_or_404(name: str) -> ProviderAccessView:
    found = provider_access_list(provider=name)
    if not found:
        raise NotFound(f"No provider named {name!r}.", code="provider_not_found")
    return found[0]


class AdminProviderAccessListApi(APIView):
    """``GET /api/admin/providers``: every provider's access (built-in, the server
    default, custom ones, the demo), and the rules of providers deleted since."""

    permission_classes = (IsAdminUser,)
    OutputSerializer = list_output(
        key="providers", item=ProviderAccessOutput, ref_name="AdminProviderAccessListOutput"
    )

    @extend_schema(
        operation_id="admin_providers_list",
        responses={200: OutputSerializer, **error_responses(403)},
    )
    def get(self, request: Request) -> Response:
        return Response(self.OutputSerializer({"providers": provider_access_list()}).data)


class AdminProviderAccessDetailApi(APIView):
    """``GET /api/admin/providers/{name}``: one provider's access; ``PATCH`` ``{access?,
    teams?, model_limits?}`` sets it (400 ``unknown_team``, ``invalid_models``; 404
    ``provider_not_found``)."""

    permission_classes = (IsAdminUser,)

    @extend_schema(
        operation_id="admin_providers_retrieve",
        responses={200: ProviderAccessOutput, **error_responses(403, 404)},
    )
    def get(self, request: Request, name: str) -> Response:
        return Response(ProviderAccessOutput(_access_or_404(name)).data)

    @extend_schema(
        operation_id="admin_providers_update",
        request=ProviderAccessInput,
        responses={200: ProviderAccessOutput, **error_responses(400, 403, 404)},
    )
    def patch(self, request: Request, name: str) -> Response:
        data = ProviderAccessInput(data=request.data)
        data.is_valid(raise_exception=True)
        values = data.validated_data
        with transaction.atomic():
            rule = provider_access_set(
                provider=name,
                access=values.get("access"),
                team_ids=values.get("teams"),
                model_limits=values.get("model_limits"),
            )
            operator_write_log(request=request, obj=rule, action="change", fields=list(values))
        return Response(ProviderAccessOutput(_access_or_404(name)).data)
