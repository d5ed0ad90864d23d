"""Uploads in the conversation API tests: hand-made multipart bodies (Django's test client
strips path parts from file names itself, which would hide what PAW does with them)."""

from __future__ import annotations

import hashlib

BOUNDARY = "pawtestboundary7d1f"


def multipart_envelope(filename: str, field: str = "file") -> tuple[bytes, bytes]:
    """``(head, tail)``: what goes before and after the content of a multipart/form-data
    body with one file part, the name sent verbatim (UTF-8)."""
    head = (
        f"--{BOUNDARY}\r\n"
        f'Content-Disposition: form-data; name="{field}"; filename="{filename}"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    return head, f"\r\n--{BOUNDARY}--\r\n".encode()


def multipart(filename: str, content: bytes, field: str = "file") -> bytes:
    """A multipart/form-data body with one file part, the name sent verbatim (UTF-8)."""
    head, tail = multipart_envelope(filename, field)
    return head + content + tail


MULTIPART = f"multipart/form-data; boundary={BOUNDARY}"


def upload(client, conversation_id, filename: str, content: bytes, **extra):
    """POST one file to the conversation's files endpoint; the response."""
    return client.generic(
        "POST",
        f"/api/conversations/{conversation_id}/files",
        multipart(filename, content),
        content_type=MULTIPART,
        **extra,
    )


def sha256(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()
