"""File download responses shared by the artifact and upload endpoints."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import BinaryIO
from urllib.parse import quote

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.http import FileResponse, HttpRequest, StreamingHttpResponse

from conversations.selectors.artifacts import INLINE_CONTENT_TYPES, OpenArtifact


def content_disposition(disposition: str, name: str) -> str:
    """A ``Content-Disposition`` value per RFC 6266: an ASCII ``filename`` fallback (non-ASCII,
    quotes, backslashes and control characters replaced by ``_``) and the exact name as
    ``filename*=UTF-8''<percent-encoded>`` (RFC 5987/8187)."""
    fallback = "".join(ch if 0x20 <= ord(ch) < 0x7F and ch not in '"\\' else "_" for ch in name)
    return f"{disposition}; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


CHUNK_BYTES = 256 * 1024


async def _chunks(file: BinaryIO) -> AsyncIterator[bytes]:
    """The file's bytes in chunks, each read in a worker thread; closes the file."""
    read = sync_to_async(file.read, thread_sensitive=False)
    try:
        while chunk := await read(CHUNK_BYTES):
            yield chunk
    finally:
        file.close()


def download_response(
    request: HttpRequest, opened: OpenArtifact, *, inline: bool = False
) -> StreamingHttpResponse:
    """Stream ``opened`` (closing it when done) as an attachment, or ``inline`` when asked
    and its type is a raster image (png, jpeg, gif, webp); any other type is always an
    attachment. ``X-Content-Type-Options: nosniff`` and a sandboxing
    ``Content-Security-Policy`` keep a browser from running what the agent wrote.

    Under ASGI (Daphne) the body is an async iterator: Django would read a plain file
    response whole into memory before sending it there."""
    show_inline = inline and opened.content_type in INLINE_CONTENT_TYPES
    if isinstance(request, ASGIRequest):
        response = StreamingHttpResponse(_chunks(opened.file), content_type=opened.content_type)
        response._resource_closers.append(opened.file.close)
    else:
        response = FileResponse(opened.file, content_type=opened.content_type)
    response["Content-Length"] = str(opened.size)
    response["Content-Disposition"] = content_disposition(
        "inline" if show_inline else "attachment", opened.name
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = "private, no-store"
    return response
