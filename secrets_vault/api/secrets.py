"""A user's own secrets: names and dates out, values only in."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from paw_project.api import JsonTypedSerializer, list_output
from paw_project.errors import NotFound
from paw_project.throttles import SecretsThrottle
from secrets_vault.selectors import secret_get, secret_list
from secrets_vault.services import secret_delete, secret_set


class SecretOutput(serializers.Serializer):
    """A secret as users see it: never its value."""

    name = serializers.CharField()
    description = serializers.CharField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    last_used_at = serializers.DateTimeField(allow_null=True)


class SecretListApi(APIView):
    """``GET /api/secrets``: the caller's secrets (names, descriptions, dates)."""

    OutputSerializer = list_output(key="secrets", item=SecretOutput, ref_name="SecretListOutput")

    @extend_schema(responses=OutputSerializer, summary="List your secrets (never values)")
    def get(self, request: Request) -> Response:
        secrets = secret_list(user=request.user)
        return Response(self.OutputSerializer({"secrets": secrets}).data)


class SecretDetailApi(APIView):
    """``PUT /api/secrets/{name}`` ``{value, description?}`` sets one of the caller's
    secrets (201 when new, 200 when replaced); ``DELETE`` removes it (204). Changes are
    throttled per user."""

    throttle_classes = (SecretsThrottle,)

    class InputSerializer(JsonTypedSerializer):
        class Meta:
            ref_name = "SecretSetInput"

        # Kept exactly as sent: leading or trailing spaces may belong to the value.
        value = serializers.CharField(trim_whitespace=False, allow_blank=True)
        description = serializers.CharField(max_length=500, required=False, allow_blank=True)

    @extend_schema(request=InputSerializer, responses=SecretOutput, summary="Set a secret")
    def put(self, request: Request, name: str) -> Response:
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        secret, created = secret_set(name=name, user=request.user, **data.validated_data)
        return Response(
            SecretOutput(secret).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(responses={204: None}, summary="Delete a secret")
    def delete(self, request: Request, name: str) -> Response:
        secret = secret_get(name=name, user=request.user)
        if secret is None:
            raise NotFound(f"You have no secret named {name}.", code="secret_not_found")
        secret_delete(secret=secret)
        return Response(status=status.HTTP_204_NO_CONTENT)
