"""Uploads and downloads through a real Daphne process (the ASGI path production uses)."""

from __future__ import annotations

import http.client
import json
import os
import sys

import pytest

from accounts.models import User
from accounts.services import auth_token_pair_for
from conversations.workspaces import workspace_path
from tests.conversations.apihelpers import MULTIPART, multipart, sha256
from tests.support import child_process, free_port, wait_http, worker_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LIMIT = 2 * 1024 * 1024


@pytest.fixture
def server():
    port = free_port()
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port)]
    command.append("paw_project.asgi:application")
    env = {"PAW_DATABASE_URL": worker_database_url(), "PAW_MAX_UPLOAD_BYTES": str(LIMIT)}
    with child_process(command, env=env) as process:
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
        return response.status, response.read(), dict(response.getheaders())
    finally:
        connection.close()


def test_upload_download_and_limits_through_daphne(server):
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

    # Over the limit with Content-Length: refused by the ASGI guard before Django reads it.
    too_big = multipart("big.bin", b"x" * (LIMIT + 128 * 1024))
    status, body, _ = call(server, "POST", files, token, too_big, {"Content-Type": MULTIPART})
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
