"""Streaming uploads into a conversation's workspace (a Django upload handler).

The multipart body is parsed by Django in chunks (``FILE_UPLOAD_HANDLERS`` protocol); this
handler writes each chunk of the one file field ``file`` straight into the workspace
under a temporary dot-name (hidden from artifact listings), hashing and counting as it
goes, so a file is never whole in memory. The limit (``PAW_MAX_UPLOAD_BYTES``) is checked
against ``Content-Length`` before any byte is read and again while counting; a refused
or interrupted upload leaves no file behind. The service
``conversations.services.files.file_create`` then moves the staged file to its final name.
"""

from __future__ import annotations

import contextlib
import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.core.files.uploadhandler import FileUploadHandler, StopFutureHandlers

from paw_project.asgi_limits import ENVELOPE_BYTES
from paw_project.errors import InvalidRequest, PayloadTooLarge

UPLOAD_FIELD = "file"
STAGING_PREFIX = ".upload-"
# Room for the multipart envelope (boundaries, part headers) around a file of the maximum
# size when a request's Content-Length is judged before parsing (the same allowance as the
# ASGI guard's).
MULTIPART_OVERHEAD_BYTES = ENVELOPE_BYTES


def too_large(limit: int) -> PayloadTooLarge:
    """The 413 for a file over ``limit`` bytes."""
    return PayloadTooLarge(
        f"The file is larger than the limit of {limit} bytes.",
        code="payload_too_large",
        extra={"limit": limit},
    )


@dataclass
class StagedUpload:
    """A file received into the workspace under a temporary name: ``path`` (the staged
    file), ``name`` (as the client sent it, after Django stripped path parts and
    non-printable characters), ``size`` (bytes), ``sha256`` (hex digest),
    ``content_type`` (as the client said; informative only)."""

    path: Path
    name: str
    size: int
    sha256: str
    content_type: str

    def close(self) -> None:
        """Nothing to close: the handler closed the file in ``file_complete``. (Django's
        multipart parser closes every file it collected when parsing fails, e.g. on a
        second file part.)"""

    def discard(self) -> None:
        """Remove the staged file if it is still there (idempotent)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class WorkspaceUploadHandler(FileUploadHandler):
    """Writes the multipart field ``file`` into a workspace folder, hashing as it goes.

    ``folder`` is called when the file part starts (after authentication: it checks the
    conversation belongs to the user and returns its workspace, raising ``NotFound``
    otherwise). ``limit`` is the most bytes the file may have. Raises ``PayloadTooLarge``
    (413) from ``Content-Length`` before reading, or as soon as the count passes the limit;
    ``InvalidRequest`` (400) for a second file part. Call :meth:`cleanup` when the request
    ends: it removes a staged file that no service claimed.
    """

    chunk_size = 256 * 1024

    def __init__(self, request: Any, *, folder: Callable[[], Path], limit: int) -> None:
        super().__init__(request)
        self._folder = folder
        self._limit = limit
        self._file: Any = None
        self._staged: StagedUpload | None = None
        self._hash: Any = None
        self._size = 0
        self._active = False

    def handle_raw_input(self, input_data, META, content_length, boundary, encoding=None) -> None:
        if content_length and content_length > self._limit + MULTIPART_OVERHEAD_BYTES:
            raise too_large(self._limit)

    def new_file(self, field_name: str, file_name: str, content_type: str, *args, **kwargs):
        if field_name != UPLOAD_FIELD:
            self._active = False  # other file fields are read past and dropped
            return
        if self._staged is not None:
            raise InvalidRequest(
                "Send one file per request, in the multipart field `file`.", code="invalid"
            )
        folder = self._folder()
        path = folder / f"{STAGING_PREFIX}{secrets.token_hex(8)}.part"
        self._file = open(path, "xb")  # noqa: SIM115 - closed in file_complete/cleanup
        self._staged = StagedUpload(
            path=path, name=file_name, size=0, sha256="", content_type=content_type or ""
        )
        self._hash = hashlib.sha256()
        self._size = 0
        self._active = True
        raise StopFutureHandlers()

    def receive_data_chunk(self, raw_data: bytes, start: int) -> None:
        if not self._active:
            return None
        self._size += len(raw_data)
        if self._size > self._limit:
            self.cleanup()
            raise too_large(self._limit)
        self._file.write(raw_data)
        self._hash.update(raw_data)
        return None

    def file_complete(self, file_size: int) -> StagedUpload | None:
        if not self._active:
            return None
        self._active = False
        self._file.close()
        self._file = None
        self._staged.size = self._size
        self._staged.sha256 = self._hash.hexdigest()
        return self._staged

    def upload_interrupted(self) -> None:
        self.cleanup()

    def cleanup(self) -> None:
        """Close and remove the staged file unless a service moved it into place."""
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._staged is not None:
            self._staged.discard()
        self._active = False
