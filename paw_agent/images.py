"""Images sent to the model: workspace files as OpenAI image content parts.

A run's ``attachments`` (the submit's, capability ``images``) and the ``view_image`` tool
turn a PNG, JPEG or WebP file of the workspace into a chat-completions content part::

    {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}

(https://platform.openai.com/docs/guides/images-vision, the format every OpenAI-compatible
endpoint that accepts images takes). The type comes from the file's first bytes, never
from its name; a file over ``max_bytes`` is refused (not downscaled).
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

from paw_agent.workspace import Workspace

#: Largest image sent by default (bytes); the host passes its own (``--max-image-bytes``).
DEFAULT_MAX_BYTES = 20 * 1024 * 1024
#: What one image counts for when a request's size is estimated (characters of text, about
#: 1,000 tokens: a detailed image of about 1024×1024 pixels at OpenAI's rate).
IMAGE_ESTIMATE_CHARS = 3_500


class ImageRefused(ValueError):
    """A file that cannot be sent as an image; the message says why, naming it."""


def image_media_type(head: bytes) -> str | None:
    """``image/png``, ``image/jpeg`` or ``image/webp`` for a file starting with ``head``
    (its first 12 or more bytes), else None."""
    if head.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if head.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "image/webp"
    return None


def _size_text(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB" if size >= 1024 * 1024 else f"{size:,} bytes"


def image_part(
    workspace: Workspace, path: str, max_bytes: int = DEFAULT_MAX_BYTES
) -> dict[str, Any]:
    """The image content part of the workspace file ``path``.

    Raises :class:`ImageRefused` for a path outside the workspace, a missing file or a
    folder, a file that is not PNG, JPEG or WebP, or one larger than ``max_bytes``."""
    try:
        resolved = workspace.resolve(path)
    except ValueError as exc:
        raise ImageRefused(str(exc)) from exc
    if not resolved.is_file():
        raise ImageRefused(f"no image file {path!r} in the workspace")
    size = resolved.stat().st_size
    with resolved.open("rb") as handle:
        head = handle.read(16)
        media_type = image_media_type(head)
        if media_type is None:
            raise ImageRefused(f"{path!r} is not a PNG, JPEG or WebP image")
        if size > max_bytes:
            raise ImageRefused(
                f"{path!r} is {_size_text(size)}, more than the {_size_text(max_bytes)} an "
                "image sent to the model may be"
            )
        data = head + handle.read(max_bytes + 1 - len(head))
    if len(data) > max_bytes:
        raise ImageRefused(f"{path!r} grew past {_size_text(max_bytes)} while it was read")
    encoded = base64.b64encode(data).decode("ascii")
    return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{encoded}"}}


def _is_image_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "image_url"


def count_images(messages: list[dict[str, Any]]) -> int:
    """How many image content parts ``messages`` carry."""
    return sum(
        1
        for message in messages
        if isinstance(message.get("content"), list)
        for part in message["content"]
        if _is_image_part(part)
    )


def estimate_text(payload: Any) -> str:
    """``payload`` (messages, tools) as JSON text for a size estimate, each image content
    part counted as :data:`IMAGE_ESTIMATE_CHARS` characters instead of its base64 data
    (a 1 MB photo is about a thousand tokens, not a million)."""
    if not isinstance(payload, list) or not count_images(
        [m for m in payload if isinstance(m, dict)]
    ):
        return json.dumps(payload, ensure_ascii=False)
    light = copy.copy(payload)
    for n, message in enumerate(light):
        if isinstance(message, dict) and isinstance(message.get("content"), list):
            parts = [
                {"type": "image_url", "image_url": {"url": "x" * IMAGE_ESTIMATE_CHARS}}
                if _is_image_part(part)
                else part
                for part in message["content"]
            ]
            light[n] = {**message, "content": parts}
    return json.dumps(light, ensure_ascii=False)
