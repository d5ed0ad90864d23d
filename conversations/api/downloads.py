"""File download responses shared by the artifact and upload endpoints."""

from __future__ import annotations

from urllib.parse import quote

from django.http import FileResponse

from conversations.selectors.artifacts import INLINE_CONTENT_TYPES, OpenArtifact


def content_disposition(disposition: str, name: str) -> str:
    """A ``Content-Disposition`` value per RFC 6266: an ASCII ``filename`` fallback (non-ASCII,
    quotes, backslashes and control characters replaced by ``_``) and the exact name as
    ``filename*=UTF-8''<percent-encoded>`` (RFC 5987/8187)."""
    fallback = "".join(ch if 0x20 <= ord(ch) < 0x7F and ch not in '"\\' else "_" for ch in name)
    return f"{disposition}; filename=\"{fallback}\"; filename*=UTF-8''{quote(name, safe='')}"


def download_response(opened: OpenArtifact, *, inline: bool = False) -> FileResponse:
    """Stream ``opened`` (closing it when done) as an attachment, or ``inline`` when asked
    and its type is a raster image (png, jpeg, gif, webp); any other type is always an
    attachment. ``X-Content-Type-Options: nosniff`` and a sandboxing
    ``Content-Security-Policy`` keep a browser from running what the agent wrote."""
    show_inline = inline and opened.content_type in INLINE_CONTENT_TYPES
    response = FileResponse(opened.file, content_type=opened.content_type)
    response["Content-Length"] = str(opened.size)
    response["Content-Disposition"] = content_disposition(
        "inline" if show_inline else "attachment", opened.name
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "default-src 'none'; sandbox"
    response["Cache-Control"] = "private, no-store"
    return response
