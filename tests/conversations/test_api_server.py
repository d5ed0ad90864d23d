"""Uploads and downloads through a real web process (``paw_project.web``, the server
production uses)."""

from __future__ import annotations

import http.client
import json
import os
import socket

import pytest

from accounts.models import User
from accounts.services import auth_token_pair_for
from conversations.selectors.workspaces import workspace_path
from tests.conversations.multipart import MULTIPART, multipart, sha256
from tests.processes import free_port, wait_http, web_process, worker_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LIMIT = 2 * 1024 * 1024


@pytest.fixture
def server():
    port = free_port()
    env = {"PAW_DATABASE_URL": worker_database_url(), "PAW_MAX_UPLOAD_BYTES": str(LIMIT)}
    with web_process(port, **env) as process:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=process)
        yield port


def call(port: int, method: str, path: str, token: str, body=None, headers=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(
            method,
            path,
            body=body,
            headers={"Authorization": f"Bearer {token}", **(headers or {})},
            encode_chunked=body is not None and not isinstance(body, bytes),
        )
        response = connection.getresponse()
        return response.status, response.read(), response.headers  # names in any case
    finally:
        connection.close()


def post_expecting_continue(
    port: int, path: str, token: str, body: bytes, content_type: str
) -> tuple[int, bytes]:
    """``POST`` with ``Expect: 100-continue`` (RFC 9110 §10.1.1): the body is sent only if
    the server asks for it. ``(status, body)`` of the final answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        head = (
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Authorization: Bearer {token}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n"
        )
        sock.sendall(head.encode())
        reader = sock.makefile("rb")
        status_line = reader.readline()
        if b" 100 " in status_line:
            while reader.readline() not in (b"\r\n", b""):
                pass
            sock.sendall(body)
            status_line = reader.readline()
        headers = {}
        while (line := reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        content = reader.read(int(headers.get("content-length", "0")))
        return int(status_line.split()[1]), content


def test_upload_download_and_limits_through_the_web_server(server):
    user = User.objects.create_user(username="alice", password="x" * 20)
    token = auth_token_pair_for(user=user)["access"]
    status, body, _ = call(
        server, "POST", "/api/conversations", token, b"{}", {"Content-Type": "application/json"}
    )
    assert status == 201, body
    conversation_id = json.loads(body)["id"]
    files = f"/api/conversations/{conversation_id}/files"
    folder = workspace_path(conversation_id)

    content = os.urandom(LIMIT)  # exactly the limit, several chunks and a spooled body
    status, body, _ = call(
        server, "POST", files, token, multipart("données.bin", content), {"Content-Type": MULTIPART}
    )
    assert status == 201, body
    created = json.loads(body)
    assert created["sha256"] == sha256(content) and created["size"] == LIMIT
    status, downloaded, headers = call(server, "GET", f"{files}/{created['id']}/content", token)
    assert status == 200 and downloaded == content
    assert "filename*=UTF-8''donn%C3%A9es.bin" in headers["Content-Disposition"]

    # Over the limit with Content-Length: refused by the ASGI guard before anything reads it,
    # so a client that waits for "100 Continue" (as curl does for large bodies) never sends it.
    too_big = multipart("big.bin", b"x" * (LIMIT + 128 * 1024))
    status, body = post_expecting_continue(server, files, token, too_big, MULTIPART)
    assert status == 413 and json.loads(body)["code"] == "payload_too_large"
    # One byte over, within the envelope allowance: refused while streaming.
    one_over = multipart("over.bin", b"x" * (LIMIT + 1))
    status, body, _ = call(server, "POST", files, token, one_over, {"Content-Type": MULTIPART})
    assert status == 413 and json.loads(body)["code"] == "payload_too_large"
    # Chunked, no Content-Length: cut off once past the limit.
    chunks = (too_big[i : i + 65536] for i in range(0, len(too_big), 65536))
    status, body, _ = call(server, "POST", files, token, chunks, {"Content-Type": MULTIPART})
    assert status == 413
    assert sorted(p.name for p in folder.iterdir()) == ["données.bin"]
