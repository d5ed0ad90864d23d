"""The web server (``paw_project.web``, uvicorn): what one request may cost in memory, and
bodies sent without ``Content-Length`` (chunked) taken like any other.

A real web process on the test database. Bodies are streamed from generators (nothing is
on disk on the client side). The server's memory is read from ``/proc``: its peak
resident size since a reset (``VmHWM`` after writing ``5`` to ``clear_refs``), so a
short spike between two samples cannot be missed.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from accounts.models import User
from accounts.services import auth_token_pair_for
from conversations.models import Conversation
from conversations.selectors.workspaces import workspace_path
from tests.conversations.multipart import MULTIPART, multipart, multipart_envelope, sha256
from tests.factories import conversation_of
from tests.processes import free_port, wait_http, web_process, worker_database_url

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

MiB = 1 << 20
GiB = 1 << 30
MB = 1000 * 1000
UPLOAD_LIMIT = 100 * MiB  # the default PAW_MAX_UPLOAD_BYTES
CHUNK = os.urandom(MiB)


class PeakRss:
    """The resident memory of process ``pid``: :meth:`reset` starts a measure, and
    :meth:`growth` is how far (bytes) its peak rose above the resident size at the reset."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.base = 0

    def _kib(self, field: str) -> int:
        status = Path(f"/proc/{self.pid}/status").read_text()
        return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.M).group(1))

    def reset(self) -> None:
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")  # VmHWM := VmRSS (Linux ≥ 4.0)
        self.base = self._kib("VmRSS")

    def growth(self) -> int:
        return (self._kib("VmHWM") - self.base) * 1024


def stream(size: int, head: bytes = b"", tail: bytes = b"") -> Iterator[bytes]:
    """``head``, ``size`` bytes of :data:`CHUNK` repeated, then ``tail``."""
    yield head
    full, rest = divmod(size, MiB)
    for _ in range(full):
        yield CHUNK
    if rest:
        yield CHUNK[:rest]
    yield tail


def file_stream(size: int) -> tuple[Iterator[bytes], int]:
    """A multipart upload of a ``size``-byte file, streamed; ``(chunks, body length)``."""
    head, tail = multipart_envelope("big.bin")
    return stream(size, head, tail), len(head) + size + len(tail)


def content_sha256(size: int) -> str:
    digest = hashlib.sha256()
    for chunk in stream(size):
        digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def server(django_db_setup, django_db_blocker):
    """``(base URL, PeakRss of the web process)``, with the default body limits."""
    port = free_port()
    with django_db_blocker.unblock():
        env = {"PAW_DATABASE_URL": worker_database_url(), "PAW_THROTTLE_UPLOADS": "1000/min"}
    with web_process(port, **env) as process:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", process=process)
        yield base, PeakRss(process.pid)


@pytest.fixture
def signed_in(server):
    """``(httpx client signed in with a JWT, conversation id)``, after one small upload
    and one token call so that the server has loaded everything they use."""
    base, _ = server
    user = User.objects.create_user(username="alice", password="x" * 20)
    conversation = conversation_of(user)
    headers = {"Authorization": f"Bearer {auth_token_pair_for(user=user)['access']}"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as client:
        chunks, length = file_stream(1000)
        warm = client.post(
            f"/api/conversations/{conversation.id}/files",
            content=b"".join(chunks),
            headers={"Content-Type": MULTIPART, "Content-Length": str(length)},
        )
        assert warm.status_code == 201, warm.text
        httpx.post(f"{base}/api/auth/token", json={"username": "alice", "password": "no"})
        yield client, conversation.id


def post(client: httpx.Client, path: str, chunks: Iterator[bytes], **headers: str):
    """POST a streamed body; httpx reads the answer even when the server closes early."""
    return client.post(path, content=chunks, headers=headers)


def assert_413(response: httpx.Response) -> None:
    assert response.status_code == 413, response.text
    assert response.json()["code"] == "payload_too_large"
    assert set(response.json()) >= {"detail", "code"}


def test_a_2_gib_upload_is_refused_while_the_server_grows_by_under_50_mb(server, signed_in):
    _, rss = server
    client, conversation_id = signed_in
    files = f"/api/conversations/{conversation_id}/files"

    rss.reset()
    chunks, length = file_stream(2 * GiB)
    response = post(
        client, files, chunks, **{"Content-Type": MULTIPART, "Content-Length": str(length)}
    )
    assert_413(response)
    assert response.json()["limit"] == UPLOAD_LIMIT
    assert rss.growth() < 50 * MB, rss.growth()

    rss.reset()
    chunks, _ = file_stream(2 * GiB)  # chunked: no length, cut off past the limit
    response = post(client, files, chunks, **{"Content-Type": MULTIPART})
    assert_413(response)
    assert rss.growth() < 50 * MB, rss.growth()
    assert [p.name for p in workspace_path(conversation_id).iterdir()] == ["big.bin"]  # the warm-up


def test_a_2_gib_body_to_the_token_endpoint_is_refused_while_the_server_grows_by_under_50_mb(
    server, signed_in
):
    base, rss = server
    for headers in ({"Content-Length": str(2 * GiB)}, {}):  # declared, then chunked
        rss.reset()
        with httpx.Client(base_url=base, timeout=120) as anonymous:
            response = post(
                anonymous,
                "/api/auth/token",
                stream(2 * GiB),
                **{"Content-Type": "application/json"},
                **headers,
            )
        assert_413(response)
        assert response.json()["limit"] == 64 * 1024  # PAW_MAX_ANONYMOUS_BODY_KIB
        assert rss.growth() < 50 * MB, rss.growth()


def test_four_concurrent_100_mib_uploads_succeed_while_the_server_grows_by_under_100_mb(
    server, signed_in
):
    _, rss = server
    client, conversation_id = signed_in
    files = f"/api/conversations/{conversation_id}/files"

    def upload(_: int) -> httpx.Response:
        chunks, length = file_stream(UPLOAD_LIMIT)
        headers = {"Content-Type": MULTIPART, "Content-Length": str(length)}
        return post(client, files, chunks, **headers)

    rss.reset()
    with ThreadPoolExecutor(max_workers=4) as pool:
        responses = list(pool.map(upload, range(4)))
    growth = rss.growth()
    assert [r.status_code for r in responses] == [201] * 4, [r.text for r in responses]
    digest = content_sha256(UPLOAD_LIMIT)
    assert {(r.json()["size"], r.json()["sha256"]) for r in responses} == {(UPLOAD_LIMIT, digest)}
    assert len({r.json()["name"] for r in responses}) == 4  # big (1).bin … big (4).bin
    assert growth < 100 * MB, growth


def test_a_request_head_over_64_kib_gets_431_and_costs_no_memory(server):
    base, rss = server
    port = int(base.rsplit(":", 1)[1])
    rss.reset()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: ")
        sent, answer = 0, b""
        deadline = time.monotonic() + 30
        while not answer and sent < 300 * MiB and time.monotonic() < deadline:
            try:
                sock.sendall(b"a" * 65536)  # a valid header value that never ends
                sent += 65536
            except OSError:
                break  # closed by the server: read its answer
            sock.setblocking(False)
            try:
                answer = sock.recv(4096)
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
        while not answer.endswith(b"too large."):
            try:
                more = sock.recv(4096)
            except ConnectionResetError:
                break
            if not more:
                break
            answer += more
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    assert sent < 64 * MiB  # refused long before the client stopped (kernel buffers aside)
    assert rss.growth() < 50 * MB, rss.growth()


def send_chunked(
    base: str, path: str, headers: dict[str, str], pieces: Iterator[bytes]
) -> tuple[int, dict]:
    """POST ``pieces`` to ``path`` over a plain socket as curl does with ``-H
    'Transfer-Encoding: chunked'``: no ``Content-Length``, each piece one chunk (``<size in
    hex>CRLF<bytes>CRLF``), then the last chunk ``0CRLFCRLF``. A server that answers
    early (and closes) stops the sending; returns ``(status, JSON body)``."""
    port = int(base.rsplit(":", 1)[1])
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n" + "".join(
        f"{name}: {value}\r\n" for name, value in headers.items()
    )
    head += "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.sendall(head.encode())
        try:
            for piece in pieces:
                if piece:
                    sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
            sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed early: read the answer
        response = http.client.HTTPResponse(sock)
        response.begin()
        return response.status, json.loads(response.read())


def pieces_of(data: bytes, sizes: tuple[int, ...] = (1, 7, 100, 4096)) -> Iterator[bytes]:
    """``data`` cut in chunks of the given sizes in turn (one byte, a few, a page …), so
    chunk boundaries fall inside the multipart boundary and headers too."""
    at, turn = 0, 0
    while at < len(data):
        size = sizes[turn % len(sizes)]
        yield data[at : at + size]
        at, turn = at + size, turn + 1


def test_a_small_chunked_upload_is_stored_byte_for_byte_like_any_other(server, signed_in):
    """``curl -H 'Transfer-Encoding: chunked' -F file=@small.txt``: a 6 kB file, no
    ``Content-Length``, was answered 400 "No file was sent." (Django's multipart parser
    takes a missing length for an empty body)."""
    base, _ = server
    client, conversation_id = signed_in
    content = os.urandom(6000)
    status, body = send_chunked(
        base,
        f"/api/conversations/{conversation_id}/files",
        {"Authorization": client.headers["Authorization"], "Content-Type": MULTIPART},
        pieces_of(multipart("small.txt", content)),
    )
    assert status == 201, body
    assert (body["name"], body["size"], body["sha256"]) == ("small.txt", 6000, sha256(content))
    assert (workspace_path(conversation_id) / "small.txt").read_bytes() == content

    # A streaming client (httpx with a generator body sends it chunked too).
    response = post(
        client,
        f"/api/conversations/{conversation_id}/files",
        pieces_of(multipart("streamed.bin", content), (65536,)),
        **{"Content-Type": MULTIPART},
    )
    assert response.status_code == 201, response.text
    assert (workspace_path(conversation_id) / "streamed.bin").read_bytes() == content


def test_curl_s_chunked_upload_of_the_issue_is_stored(server, signed_in, tmp_path):
    """Issue 25's own reproduction, with curl (``-F`` and the chunked header)."""
    curl = shutil.which("curl")
    if curl is None:
        pytest.skip("curl is not installed")
    base, _ = server
    client, conversation_id = signed_in
    small = tmp_path / "small.txt"
    small.write_bytes(b"6 kB of text\n" * 470)
    answer = subprocess.run(
        [
            curl, "-sS", "--fail-with-body", "-H", "Transfer-Encoding: chunked",
            "-H", f"Authorization: {client.headers['Authorization']}",
            "-F", f"file=@{small}", f"{base}/api/conversations/{conversation_id}/files",
        ],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert answer.returncode == 0, (answer.stdout, answer.stderr)
    assert json.loads(answer.stdout)["size"] == small.stat().st_size
    assert (workspace_path(conversation_id) / "small.txt").read_bytes() == small.read_bytes()


def test_a_chunked_upload_at_the_limit_is_stored_and_one_byte_more_is_413_in_flat_memory(
    server, signed_in
):
    """Past the limit by one byte the body is still within the ASGI guard's allowance for
    the envelope: the upload handler refuses it while counting the file."""
    base, rss = server
    client, conversation_id = signed_in
    files = f"/api/conversations/{conversation_id}/files"
    headers = {"Authorization": client.headers["Authorization"], "Content-Type": MULTIPART}
    head, tail = multipart_envelope("limit.bin")

    rss.reset()
    status, body = send_chunked(base, files, headers, stream(UPLOAD_LIMIT, head, tail))
    assert status == 201, body
    assert (body["size"], body["sha256"]) == (UPLOAD_LIMIT, content_sha256(UPLOAD_LIMIT))
    assert rss.growth() < 50 * MB, rss.growth()

    rss.reset()
    status, body = send_chunked(base, files, headers, stream(UPLOAD_LIMIT + 1, head, tail))
    assert status == 413, body
    assert (body["code"], body["limit"]) == ("payload_too_large", UPLOAD_LIMIT)
    assert rss.growth() < 50 * MB, rss.growth()

    rss.reset()  # far over: cut off by the ASGI guard once past the limit
    status, body = send_chunked(base, files, headers, stream(2 * UPLOAD_LIMIT, head, tail))
    assert status == 413, body
    assert body["code"] == "payload_too_large"
    assert rss.growth() < 50 * MB, rss.growth()
    assert sorted(p.name for p in workspace_path(conversation_id).iterdir()) == [
        "big.bin",  # the warm-up
        "limit.bin",
    ]


def test_a_chunked_json_body_reaches_the_view(server, signed_in):
    """DRF also took a missing ``Content-Length`` for an empty body: the conversation was
    created without its title."""
    base, _ = server
    client, _ = signed_in
    status, body = send_chunked(
        base,
        "/api/conversations",
        {"Authorization": client.headers["Authorization"], "Content-Type": "application/json"},
        pieces_of(json.dumps({"title": "Sent in chunks"}).encode(), (3,)),
    )
    assert status == 201, body
    assert body["title"] == "Sent in chunks"
    assert Conversation.objects.get(id=body["id"]).title == "Sent in chunks"


def _answer_to(port: int, request: bytes) -> bytes:
    """The server's whole answer to ``request`` sent in one write (the connection closed
    by the server or after its first response)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith((b".", b"}")):
            try:
                more = sock.recv(65536)
            except ConnectionResetError:
                break
            if not more:
                break
            answer += more
    return answer


@pytest.mark.parametrize(
    "headers",
    [
        [b"X-Padding: " + b"a" * 100_000],  # one header over the limit
        [b"X-Pad-%d: " % i + b"b" * 8_000 for i in range(20)],  # many, over it together
    ],
    ids=["one-big-header", "many-headers"],
)
def test_a_head_over_64_kib_that_arrives_whole_also_gets_431(server, headers):
    base, _ = server
    port = int(base.rsplit(":", 1)[1])
    head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
    answer = _answer_to(port, head + b"\r\n".join(headers) + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431 "), answer[:200]
    # Just under the limit is still served.
    under = head + b"X-Padding: " + b"c" * 60_000 + b"\r\n\r\n"
    assert _answer_to(port, under).startswith(b"HTTP/1.1 200 ")


def test_websocket_messages_are_bounded_and_the_socket_keeps_paw_s_behaviour(server, signed_in):
    """Over 64 KiB: PAW's ``error`` and the socket stays open; over 256 KiB the server
    closes it (1009) before the message is whole in memory. The JWT subprotocol, the
    origin check and the close codes work as under any ASGI server."""
    import websockets
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    base, _ = server
    client, conversation_id = signed_in
    token = client.headers["Authorization"].removeprefix("Bearer ")
    other = User.objects.create_user(username="mallory", password="x" * 20)
    other_token = auth_token_pair_for(user=other)["access"]
    url = f"ws://{base.removeprefix('http://')}/ws/conversations/{conversation_id}/"
    origin = base

    async def talk() -> None:
        with pytest.raises(InvalidStatus) as refused:  # a foreign origin: HTTP 403
            await websockets.connect(url, origin="http://evil.example", subprotocols=["paw", token])
        assert refused.value.response.status_code == 403

        async with websockets.connect(url, origin=origin, subprotocols=["paw", token]) as socket_:
            assert socket_.subprotocol == "paw"
            await socket_.send(json.dumps({"type": "ping", "pad": "a" * 100_000}))
            reply = json.loads(await socket_.recv())
            while reply["type"] != "error":  # the pending state sent on connect comes first
                reply = json.loads(await socket_.recv())
            assert reply["code"] == "too_large"
            await socket_.send(json.dumps({"type": "ping"}))
            assert json.loads(await socket_.recv())["type"] == "pong"
            await socket_.send("x" * (300 * 1024))
            with pytest.raises(ConnectionClosed) as closed:
                await socket_.recv()
            assert closed.value.rcvd.code == 1009

        async with websockets.connect(
            url, origin=origin, subprotocols=["paw", other_token]
        ) as socket_:
            with pytest.raises(ConnectionClosed) as closed:
                await socket_.recv()
            assert closed.value.rcvd.code == 4404  # another's conversation: ids cannot be probed

    asyncio.run(talk())
