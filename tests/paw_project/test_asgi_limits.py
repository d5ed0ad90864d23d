"""The ASGI body guard: oversized bodies get 413 before the application reads them."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import override_settings

from paw_project.asgi import application
from paw_project.asgi_limits import ENVELOPE_BYTES


def http_scope(headers: list[tuple[bytes, bytes]]) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/api/conversations",
        "raw_path": b"/api/conversations",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"localhost"), *headers],
        "client": ("127.0.0.1", 5555),
        "server": ("127.0.0.1", 8000),
    }


async def call(scope: dict, chunks: list[bytes]) -> tuple[list[dict], int]:
    """Run the ASGI application; returns (sent messages, body chunks it read)."""
    sent: list[dict] = []
    pending = list(chunks)
    reads = 0

    async def receive() -> dict:
        nonlocal reads
        if not pending:
            await asyncio.Event().wait()  # the client stays connected

        reads += 1
        chunk = pending.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    async def send(message: dict) -> None:
        sent.append(message)

    await application(scope, receive, send)
    return sent, reads


@override_settings(PAW_MAX_UPLOAD_BYTES=1000)
async def test_a_content_length_over_the_limit_is_refused_without_reading_the_body():
    length = 1000 + ENVELOPE_BYTES + 1
    sent, reads = await call(
        http_scope([(b"content-length", str(length).encode())]), [b"x" * 10] * 3
    )
    assert reads == 0
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["code"] == "payload_too_large"


@override_settings(PAW_MAX_UPLOAD_BYTES=1000)
async def test_a_body_without_length_is_cut_off_once_over_the_limit():
    chunk = b"x" * 16 * 1024
    chunks = [chunk] * 20  # 320 KiB, no Content-Length (chunked)
    sent, reads = await call(http_scope([]), chunks)
    assert sent[0]["status"] == 413
    assert reads < len(chunks)  # stopped reading part-way


@pytest.mark.django_db
async def test_a_small_body_passes_through_to_django():
    sent, _ = await call(
        http_scope([(b"content-length", b"2"), (b"content-type", b"application/json")]), [b"{}"]
    )
    assert sent[0]["status"] == 401  # reached the API (unauthenticated)
