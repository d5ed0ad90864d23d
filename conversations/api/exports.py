"""Export API: a conversation as Markdown (a zip with its files), JSON or a notebook."""

from __future__ import annotations

from uuid import UUID

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers
from rest_framework.negotiation import DefaultContentNegotiation
from rest_framework.request import Request
from rest_framework.views import APIView

from conversations.api.downloads import download_response
from conversations.api.events import EventOutput
from conversations.exports import EXPORT_FORMATS, EXPORT_MAX_EVENTS, conversation_export
from paw_project.api import error_responses


class _FormatIsAQueryParameter(DefaultContentNegotiation):
    """DRF reads ``?format=`` as a renderer's name (``URL_FORMAT_OVERRIDE``); here it is
    the export's format, and errors are JSON as everywhere."""

    def select_renderer(self, request, renderers, format_suffix=None):
        return renderers[0], renderers[0].media_type


#: What each format answers (`md`: a zip, or plain Markdown when it shows no files). JSON
#: first: schema checkers (schemathesis) validate a JSON body against the first one.
EXPORT_MEDIA_TYPES = (
    "application/json",
    "application/x-ipynb+json",
    "application/zip",
    "text/markdown",
)


def _export_response(media_type: str) -> OpenApiResponse:
    """The 200 answer documented for one media type: JSON (events, a notebook) as an
    object, the rest as bytes."""
    body = OpenApiTypes.OBJECT if "json" in media_type else OpenApiTypes.BINARY
    return OpenApiResponse(body, description=_EXPORT_DESCRIPTION)


_EXPORT_DESCRIPTION = (
    "The export as an attachment named after the title (`Content-Disposition` with an "
    "RFC 6266 `filename*`): `md` is `application/zip` or `text/markdown`, `json` "
    "`application/json`, `ipynb` `application/x-ipynb+json`. At most "
    f"{EXPORT_MAX_EVENTS} events are read (the export says where it stops); workspace "
    "files are included as they are now, up to 10 MB each and 50 MB in all."
)


class ConversationExportApi(APIView):
    content_negotiation_class = _FormatIsAQueryParameter

    class QuerySerializer(serializers.Serializer):
        format = serializers.ChoiceField(
            choices=EXPORT_FORMATS,
            help_text=(
                "`md`: Markdown, a zip of `conversation.md` and the workspace files it shows "
                "(under `files/`, linked relatively), or a plain `.md` when it shows none; "
                "`json`: the stored events (as the events API returns them) with the "
                "conversation's details; `ipynb`: a Jupyter notebook (nbformat 4)."
            ),
        )

    @extend_schema(
        operation_id="conversations_export",
        parameters=[QuerySerializer],
        responses={
            **{
                (200, media_type): _export_response(media_type) for media_type in EXPORT_MEDIA_TYPES
            },
            **error_responses(400, 404),
        },
    )
    def get(self, request: Request, conversation_id: UUID):
        """Export the conversation. Only its owner can (404 for anyone else)."""
        query = self.QuerySerializer(data=request.query_params)
        query.is_valid(raise_exception=True)
        export = conversation_export(
            user=request.user,
            conversation_id=conversation_id,
            export_format=query.validated_data["format"],
            event_form=lambda event: EventOutput(event).data,
        )
        return download_response(request._request, export)
