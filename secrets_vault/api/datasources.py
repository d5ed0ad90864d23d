"""The datasources a user may give a run."""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from paw_project.api import list_output
from secrets_vault.selectors import datasources_for_user


class DatasourceOutput(serializers.Serializer):
    """A datasource as users see it: never its connection settings."""

    slug = serializers.CharField()
    name = serializers.CharField()
    description = serializers.CharField()
    dialect = serializers.CharField()


class DatasourceListApi(APIView):
    """``GET /api/datasources``: the enabled datasources the caller may give a run (the
    access rule: ``selectors.datasources_for_user``)."""

    OutputSerializer = list_output(
        key="datasources", item=DatasourceOutput, ref_name="DatasourceListOutput"
    )

    @extend_schema(responses=OutputSerializer, summary="List the datasources runs may use")
    def get(self, request: Request) -> Response:
        return Response(
            self.OutputSerializer({"datasources": datasources_for_user(request.user)}).data
        )
