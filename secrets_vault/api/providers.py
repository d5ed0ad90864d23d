"""Model providers: which ones a user can pick, and the user's default."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from paw_project.api import JsonTypedSerializer, list_output
from secrets_vault.selectors import provider_list, provider_preference_get
from secrets_vault.services import provider_default_set


class ProviderOutput(serializers.Serializer):
    """A provider as one user sees it ("" reason when active)."""

    name = serializers.CharField()
    label = serializers.CharField()
    active = serializers.BooleanField()
    reason_if_inactive = serializers.CharField()
    default_model = serializers.CharField()
    models = serializers.ListField(child=serializers.CharField())
    vision_models = serializers.ListField(
        child=serializers.CharField(),
        help_text="Those of `models` that accept images (a run's `attachments`).",
    )


class ProviderListApi(APIView):
    """``GET /api/providers``: every provider with whether it is active for the caller
    (and why not), its default model and models (live list, cached)."""

    OutputSerializer = list_output(
        key="providers", item=ProviderOutput, ref_name="ProviderListOutput"
    )

    @extend_schema(responses=OutputSerializer, summary="List model providers")
    def get(self, request: Request) -> Response:
        providers = provider_list(user=request.user)
        return Response(self.OutputSerializer({"providers": providers}).data)


class ProviderDefaultApi(APIView):
    """``GET /api/providers/default``: the caller's default ``{llm_provider, llm_model}``
    ("" when none); ``PUT`` sets it (validated like a run's choice; empty clears)."""

    class InputSerializer(JsonTypedSerializer):
        class Meta:
            ref_name = "ProviderDefaultInput"

        llm_provider = serializers.CharField(max_length=64, allow_blank=True)
        llm_model = serializers.CharField(max_length=200, allow_blank=True, required=False)

    class OutputSerializer(serializers.Serializer):
        class Meta:
            ref_name = "ProviderDefaultOutput"

        llm_provider = serializers.CharField()
        llm_model = serializers.CharField()

    @extend_schema(responses=OutputSerializer, summary="Your default provider and model")
    def get(self, request: Request) -> Response:
        preference = provider_preference_get(user=request.user)
        data = {"llm_provider": "", "llm_model": ""}
        if preference is not None:
            data = {"llm_provider": preference.llm_provider, "llm_model": preference.llm_model}
        return Response(self.OutputSerializer(data).data)

    @extend_schema(
        request=InputSerializer, responses=OutputSerializer, summary="Set your default provider"
    )
    def put(self, request: Request) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        preference = provider_default_set(user=request.user, **data.validated_data)
        return Response(self.OutputSerializer(preference).data)
