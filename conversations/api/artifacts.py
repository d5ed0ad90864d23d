"""Artifacts API: list the files the agent made, download one."""

from __future__ import annotations

from uuid import UUID

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.api.downloads import DownloadQuery, download_response
from conversations.selectors.artifacts import artifact_list, artifact_open
from paw_project.api import PawPagination, error_responses, paginated_response


class ArtifactOutput(serializers.Serializer):
    path = serializers.CharField(help_text="Relative to the workspace, `/`-separated.")
    size = serializers.IntegerField(help_text="bytes")
    modified = serializers.DateTimeField()
    content_type = serializers.CharField(help_text="Guessed from the extension.")


class ArtifactListApi(APIView):
    pagination_class = PawPagination

    @extend_schema(
        operation_id="artifacts_list",
        responses={200: ArtifactOutput(many=True), **error_responses(404)},
    )
    def get(self, request: Request, conversation_id: UUID) -> Response:
        """Every file of the workspace the agent made (recursively, sorted by path): uploads
        and the runtime's private dot-folders are left out. Paginated: `page`, `page_size`
        up to 100, default 20."""
        return paginated_response(
            request=request,
            view=self,
            queryset=artifact_list(user=request.user, conversation_id=conversation_id),
            serializer_class=ArtifactOutput,
            pagination_class=PawPagination,
        )


class ArtifactDownloadApi(APIView):
    QuerySerializer = DownloadQuery

    @extend_schema(
        operation_id="artifacts_download",
        parameters=[
            QuerySerializer,
            OpenApiParameter(
                "path", OpenApiTypes.STR, OpenApiParameter.PATH, description="Relative path."
            ),
        ],
        responses={
            200: OpenApiResponse(
                OpenApiTypes.BINARY,
                description="The file; `Content-Disposition` with an RFC 6266 `filename*`.",
            ),
            **error_responses(400, 404),
        },
    )
    def get(self, request: Request, conversation_id: UUID, path: str):
        """Download a file of the workspace. `..`, absolute paths, private dot-folders and
        symlinks leading outside the workspace answer 404."""
        query = self.QuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        opened = artifact_open(user=request.user, conversation_id=conversation_id, path=path)
        return download_response(request._request, opened, inline=query.validated_data["inline"])
