"""File download responses shared by the artifact and upload endpoints."""

from __future__ import annotations

from urllib.parse import quote

from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, HttpRequest, StreamingHttpResponse
from rest_framework import serializers

from conversations.selectors.artifacts import INLINE_CONTENT_TYPES, OpenArtifact
from paw_project.streaming import file_chunks


class DownloadQuery(serializers.Serializer):
    """The query of a file download (a workspace's artifact, a share's copy): ``inline``."""

    inline = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Show in the browser; honoured for png, jpeg, gif and webp only.",
    )


def content_disposition(disposition: str, name: str) -> str:
    """A ``Content-Disposition`` value per RFC 6266: an ASCII ``filename`` fallback (non-ASCII,
    quotes, backslashes and control characters replaced by ``_``) and the exact name as
    ``filename*=UTF-8''<percent-encoded>`` (RFC 5987/8187)."""
    fallback = "".join(ch if 0x20 <= ord(ch) < 0x7F and ch not in '"\\' else "_" for ch in name)
    return f"{disposition}; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


#: Types a page could load from PAW's own origin as a script, a worker or a stylesheet
#: (``<script src>``, ``new Worker``, ``<link rel=stylesheet>`` accept them under
#: ``nosniff``): an agent-written ``x.js`` would otherwise be a script the chat page's
#: ``script-src 'self'`` allows. They are sent as plain text (still an attachment, under
#: their own name), which browsers refuse to run or apply.
ACTIVE_CONTENT_TYPES = frozenset(
    {
        "application/javascript", "application/ecmascript", "application/x-javascript",
        "application/x-ecmascript", "text/javascript", "text/ecmascript", "text/jscript",
        "text/x-javascript", "text/x-ecmascript", "application/wasm", "text/css",
        "application/manifest+json", "text/x-python-script",
    }
)  # fmt: skip


def download_response(
    request: HttpRequest, opened: OpenArtifact, *, inline: bool = False
) -> StreamingHttpResponse:
    """Stream ``opened`` (closing it when done) as an attachment, or ``inline`` when asked
    and its type is a raster image (png, jpeg, gif, webp); any other type is always an
    attachment. ``X-Content-Type-Options: nosniff``, a sandboxing
    ``Content-Security-Policy`` and plain text for :data:`ACTIVE_CONTENT_TYPES` keep a
    browser from running what the agent wrote, also when a page of PAW's origin loads it.

    Under ASGI the body is an async iterator: Django would read a plain file
    response whole into memory before sending it there."""
    show_inline = inline and opened.content_type in INLINE_CONTENT_TYPES
    content_type = opened.content_type
    if content_type.split(";")[0].strip().lower() in ACTIVE_CONTENT_TYPES:
        content_type = "text/plain; charset=utf-8"
    if isinstance(request, ASGIRequest):
        response = StreamingHttpResponse(file_chunks(opened.file), content_type=content_type)
        response._resource_closers.append(opened.file.close)
    else:
        response = FileResponse(opened.file, content_type=content_type)
    response["Content-Length"] = str(opened.size)
    response["Content-Disposition"] = content_disposition(
        "inline" if show_inline else "attachment", opened.name
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = "private, no-store"
    return response
