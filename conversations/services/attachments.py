"""Images a run sends to the model: the rules a run's ``attachments`` must follow.

A run may carry ``attachments``: paths of images in its conversation's workspace (an
upload such as ``photo.png``, or a file the agent made such as ``chart.png``). The runtime
(paw-agent, capability ``images``) sends each to the model as an image content part of the
prompt's user message (OpenAI chat completions: ``{"type": "image_url", "image_url":
{"url": "data:image/png;base64,..."}}``). Only PNG, JPEG and WebP are taken, recognised by
their first bytes (never by the name or what the uploading client said), each of at most
``PAW_MAX_IMAGE_BYTES``; and only for a model that accepts images (the provider's
``vision`` flag: ``secrets_vault.providers.model_accepts_images``). Anything else is
refused before the run is created, with a code saying why: nothing is dropped silently.
"""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from django.conf import settings

from conversations.selectors.workspaces import workspace_open, workspace_relative
from paw_project.errors import InvalidRequest

#: Most images one run may attach.
MAX_ATTACHMENTS = 8

#: Media type → how its files start (https://www.w3.org/TR/png-3/#5PNG-file-signature,
#: JPEG's SOI marker and the first marker's 0xFF, RIFF's "WEBP" form type at byte 8).
IMAGE_SIGNATURES = {
    "image/png": (0, b"\x89PNG\r\n\x1a\n"),
    "image/jpeg": (0, b"\xff\xd8\xff"),
    "image/webp": (8, b"WEBP"),
}


def image_media_type(head: bytes) -> str | None:
    """The media type (``image/png``, ``image/jpeg`` or ``image/webp``) of a file whose
    first 12 or more bytes are ``head``, or None when it is none of them."""
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "image/webp"
    for media_type, (offset, signature) in IMAGE_SIGNATURES.items():
        if offset == 0 and head.startswith(signature):
            return media_type
    return None


def _limit_text(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB" if size >= 1024 * 1024 else f"{size:,} bytes"


def attachments_validate(*, conversation_id: UUID | str, attachments: Sequence[str]) -> list[str]:
    """The run's ``attachments`` checked against the workspace: each a path relative to
    it, naming a PNG, JPEG or WebP file (by its first bytes) of at most
    ``PAW_MAX_IMAGE_BYTES``. Returns the normalised paths in the order given, each once.

    Raises :class:`InvalidRequest` (400) naming the file: ``too_many_attachments`` (over
    :data:`MAX_ATTACHMENTS`), ``attachment_not_found`` (no such file, or a path that may not
    be served: absolute, ``..``, private, leading outside), ``attachment_not_image``,
    ``attachment_too_large``.
    """
    paths: list[str] = []
    for raw in attachments:
        inside = workspace_relative(conversation_id, str(raw).strip())
        path = str(inside) if inside is not None else None
        if path is None:
            raise InvalidRequest(
                f"There is no file '{raw}' in this conversation's workspace to attach.",
                code="attachment_not_found",
                extra={"attachment": str(raw)},
            )
        if path not in paths:
            paths.append(path)
    if len(paths) > MAX_ATTACHMENTS:
        raise InvalidRequest(
            f"A message may attach at most {MAX_ATTACHMENTS} images ({len(paths)} given).",
            code="too_many_attachments",
        )
    limit = settings.PAW_MAX_IMAGE_BYTES
    for path in paths:
        opened = workspace_open(conversation_id, path)
        if opened is None:
            raise InvalidRequest(
                f"There is no file '{path}' in this conversation's workspace to attach.",
                code="attachment_not_found",
                extra={"attachment": path},
            )
        file, size = opened
        with file:
            head = file.read(16)
        if image_media_type(head) is None:
            raise InvalidRequest(
                f"'{path}' is not a PNG, JPEG or WebP image: only those can be sent to the model.",
                code="attachment_not_image",
                extra={"attachment": path},
            )
        if size > limit:
            raise InvalidRequest(
                f"'{path}' is {_limit_text(size)}, more than the {_limit_text(limit)} an image "
                "sent to the model may be (PAW_MAX_IMAGE_BYTES).",
                code="attachment_too_large",
                extra={"attachment": path, "limit": limit},
            )
    return paths


def attachments_vision_check(
    *, attachments: Sequence[str], vision: bool, provider: str, model: str
) -> None:
    """Refuse images for a model that does not accept them: :class:`InvalidRequest`
    ``model_without_vision`` (400) naming the provider and model. Nothing to check without
    attachments."""
    if attachments and not vision:
        raise InvalidRequest(
            f"The model '{model}' (provider '{provider}') does not accept images, so "
            f"{', '.join(attachments)} cannot be sent to it. Choose a model that does "
            "(GET /api/providers lists them as vision_models) or send the message "
            "without the image.",
            code="model_without_vision",
            extra={"provider": provider, "model": model},
        )
