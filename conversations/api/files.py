"""Files API: upload (streamed into the workspace), list, download, delete."""

from __future__ import annotations

from pathlib import Path
from uuid import UUID

from django.conf import settings
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.parsers import MultiPartParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from conversations.api.downloads import download_response
from conversations.models import ConversationFile
from conversations.selectors.conversations import conversation_get
from conversations.selectors.files import file_list, file_open
from conversations.services.files import file_create, file_delete
from conversations.services.workspaces import workspace_ensure
from conversations.uploads import (
    MULTIPART_OVERHEAD_BYTES,
    UPLOAD_FIELD,
    StagedUpload,
    WorkspaceUploadHandler,
    too_large,
)
from paw_project.api import PawPagination, error_responses, paginated_response
from paw_project.asgi_limits import BodyKind
from paw_project.errors import InvalidRequest, NotFound
from paw_project.throttles import UploadsThrottle


class FileOutput(serializers.ModelSerializer):
    """An uploaded file: ``name`` (as stored), ``size`` (bytes), ``sha256`` (hex)."""

    created = serializers.DateTimeField(source="created_at")

    class Meta:
        model = ConversationFile
        fields = ("id", "name", "size", "sha256", "created")
        read_only_fields = fields


class FileListApi(APIView):
    parser_classes = (MultiPartParser,)
    # PAW_MAX_UPLOAD_BYTES, not the small JSON limit, for the body (paw_project.asgi_limits).
    request_body_kind = BodyKind.UPLOAD
    pagination_class = PawPagination

    def get_throttles(self):
        # Only uploads count against PAW_THROTTLE_UPLOADS, not listing.
        return [UploadsThrottle()] if self.request.method == "POST" else []

    def initial(self, request: Request, *args, **kwargs) -> None:
        # The upload handler must be in place before anything reads the body, and the
        # session CSRF check (during authentication) reads request.POST.
        if request.method == "POST":
            limit = settings.PAW_MAX_UPLOAD_BYTES
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > limit + MULTIPART_OVERHEAD_BYTES:
                raise too_large(limit)
            conversation_id = kwargs["conversation_id"]

            def folder() -> Path:
                user = request._request.user
                if not user.is_authenticated:
                    raise NotFound("No such conversation.", code="not_found")
                conversation = conversation_get(user=user, conversation_id=conversation_id)
                return workspace_ensure(conversation.id)

            self.upload_handler = WorkspaceUploadHandler(
                request._request, folder=folder, limit=limit
            )
            request._request.upload_handlers = [self.upload_handler]
        super().initial(request, *args, **kwargs)

    def finalize_response(self, request: Request, response, *args, **kwargs):
        handler = getattr(self, "upload_handler", None)
        if handler is not None:
            handler.cleanup()  # a staged file no service claimed (error, CSRF failure …)
        return super().finalize_response(request, response, *args, **kwargs)

    @extend_schema(
        operation_id="files_list",
        responses={200: FileOutput(many=True), **error_responses(404)},
    )
    def get(self, request: Request, conversation_id: UUID) -> Response:
        """The files uploaded to the conversation, oldest first (paginated: `page`,
        `page_size` up to 100, default 20)."""
        return paginated_response(
            request=request,
            view=self,
            queryset=file_list(user=request.user, conversation_id=conversation_id),
            serializer_class=FileOutput,
            pagination_class=PawPagination,
        )

    @extend_schema(
        operation_id="files_upload",
        request={
            "multipart/form-data": inline_serializer(
                "FileUploadInput", fields={UPLOAD_FIELD: serializers.FileField()}
            )
        },
        responses={201: FileOutput, **error_responses(400, 403, 404, 413, 429)},
    )
    def post(self, request: Request, conversation_id: UUID) -> Response:
        """Upload one file (multipart field `file`) into the conversation's workspace. The
        name keeps its unicode (NFC) and loses path parts and control characters; when the
        name is taken (by an upload or a file the agent made) a suffix is added:
        `tips (1).csv`. Over `PAW_MAX_UPLOAD_BYTES`: 413 `payload_too_large`."""
        conversation_get(user=request.user, conversation_id=conversation_id)
        upload = request.FILES.get(UPLOAD_FIELD)
        if not isinstance(upload, StagedUpload):
            raise InvalidRequest(
                "Send the file in the multipart field `file`.",
                code="required",
                extra={"fields": {UPLOAD_FIELD: ["No file was sent."]}},
            )
        created = file_create(user=request.user, conversation_id=conversation_id, upload=upload)
        return Response(FileOutput(created).data, status=status.HTTP_201_CREATED)


class FileDetailApi(APIView):
    @extend_schema(operation_id="files_destroy", responses={204: None, **error_responses(403, 404)})
    def delete(self, request: Request, conversation_id: UUID, file_id: UUID) -> Response:
        """Delete an uploaded file from the conversation and its workspace."""
        file_delete(user=request.user, conversation_id=conversation_id, file_id=file_id)
        return Response(status=status.HTTP_204_NO_CONTENT)


class FileContentApi(APIView):
    @extend_schema(
        operation_id="files_download",
        responses={
            200: OpenApiResponse(OpenApiTypes.BINARY, description="The file, as an attachment."),
            **error_responses(404),
        },
    )
    def get(self, request: Request, conversation_id: UUID, file_id: UUID):
        """Download an uploaded file (its current bytes in the workspace), as an attachment."""
        opened = file_open(user=request.user, conversation_id=conversation_id, file_id=file_id)
        return download_response(request._request, opened)
