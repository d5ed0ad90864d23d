"""The ASGI body guard: oversized bodies get 413 before the application reads them, by the
limit of the endpoint and of the request's credentials."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from django.test import override_settings

from paw_project.asgi import application
from paw_project.asgi_limits import ENVELOPE_BYTES, BodyKind, body_limit

BEARER = (b"authorization", b"Bearer x")


@pytest.fixture
def valid_bearer(transactional_db):
    """An ``Authorization`` header with a real personal API token (committed: the guard
    checks it on a thread of its own)."""
    from accounts.services import personal_token_create
    from tests.factories import UserFactory

    _, raw = personal_token_create(user=UserFactory(), name="uploads")
    return (b"authorization", f"Bearer {raw}".encode())


def http_scope(headers: list[tuple[bytes, bytes]], path: str = "/api/conversations") -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
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


# A fixed id: parametrized ids must be the same in every parallel worker.
UPLOAD_PATH = f"/api/conversations/{uuid.UUID(int=7)}/files"


def length(size: int) -> tuple[bytes, bytes]:
    return (b"content-length", str(size).encode())


@override_settings(PAW_MAX_UPLOAD_BYTES=1000)
async def test_an_upload_over_its_limit_is_refused_from_content_length_without_reading(
    valid_bearer,
):
    sent, reads = await call(
        http_scope([valid_bearer, length(1000 + ENVELOPE_BYTES + 1)], UPLOAD_PATH),
        [b"x" * 10] * 3,
    )
    assert reads == 0
    assert sent[0]["status"] == 413
    assert (b"connection", b"close") in sent[0]["headers"]
    assert json.loads(sent[1]["body"]) == {
        "detail": "The file is larger than the limit of 1000 bytes.",
        "code": "payload_too_large",
        "limit": 1000,
    }


@override_settings(PAW_MAX_UPLOAD_BYTES=1000, PAW_MAX_ANONYMOUS_BODY_KIB=2)
async def test_a_chunked_upload_is_cut_off_once_over_the_limit(valid_bearer):
    chunks = [b"x" * 16 * 1024] * 20  # 320 KiB, no Content-Length (chunked)
    sent, reads = await call(http_scope([valid_bearer], UPLOAD_PATH), chunks)
    assert sent[0]["status"] == 413
    assert reads == 5  # 80 KiB read: past 1000 bytes + the 64 KiB envelope allowance


@override_settings(PAW_MAX_UPLOAD_BYTES=10 * 1024 * 1024, PAW_MAX_ANONYMOUS_BODY_KIB=2)
@pytest.mark.django_db
@pytest.mark.parametrize(
    "credentials",
    [
        BEARER,  # a made-up JWT
        (b"authorization", b"Bearer paw_" + b"x" * 43),  # a made-up personal token
        (b"authorization", b"Basic eDp4"),
        (b"cookie", b"sessionid=nope"),  # no such session
    ],
    ids=["jwt", "personal", "basic", "session"],
)
async def test_an_upload_whose_credentials_do_not_authenticate_gets_the_anonymous_limit(
    credentials,
):
    """Found by the adversarial pass: any Authorization header or session cookie let a
    stranger send a whole upload (100 MiB) before the view refused it with 401."""
    sent, reads = await call(http_scope([credentials, length(2 * 1024 + 1)], UPLOAD_PATH), [b"x"])
    assert (reads, sent[0]["status"]) == (0, 413)
    assert json.loads(sent[1]["body"])["limit"] == 2048
    chunks = [b"x" * 1024] * 10  # chunked: cut off after the anonymous limit
    sent, reads = await call(http_scope([credentials], UPLOAD_PATH), chunks)
    assert (reads, sent[0]["status"]) == (3, 413)


@override_settings(PAW_MAX_BODY_KIB=4)
async def test_any_other_body_is_held_to_the_small_json_limit():
    sent, reads = await call(http_scope([BEARER, length(4 * 1024 + 1)]), [b"{}"])
    assert (reads, sent[0]["status"]) == (0, 413)
    assert json.loads(sent[1]["body"])["limit"] == 4096
    sent, reads = await call(http_scope([BEARER]), [b"x" * 1024] * 10)
    assert (reads, sent[0]["status"]) == (5, 413)


@override_settings(PAW_MAX_BODY_KIB=1024, PAW_MAX_ANONYMOUS_BODY_KIB=2)
@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/api/auth/token", [BEARER]),  # the endpoints used before signing in, credentials or not
        ("/api/auth/token/refresh", []),
        ("/api/auth/register", [(b"cookie", b"sessionid=abc")]),
        ("/accounts/login/", []),
        ("/accounts/register/", []),
        ("/api/conversations", []),  # without credentials, wherever it goes
        ("/api/conversations", [(b"cookie", b"csrftoken=abc")]),
        (UPLOAD_PATH, []),
        ("/no/such/page", []),
    ],
)
async def test_sign_in_endpoints_and_requests_without_credentials_get_the_smallest_limit(
    path, headers
):
    sent, reads = await call(http_scope([*headers, length(2 * 1024 + 1)], path), [b"{}"])
    assert (reads, sent[0]["status"]) == (0, 413)
    assert json.loads(sent[1]["body"])["limit"] == 2048


@override_settings(PAW_MAX_BODY_KIB=4, PAW_MAX_ANONYMOUS_BODY_KIB=2)
@pytest.mark.parametrize("credentials", [BEARER, (b"cookie", b"csrftoken=a; sessionid=abc")])
async def test_credentials_of_any_kind_lift_the_anonymous_limit_elsewhere(credentials):
    assert body_limit(http_scope([credentials])) == (BodyKind.JSON, 4096)
    assert body_limit(http_scope([credentials], UPLOAD_PATH))[0] is BodyKind.UPLOAD


@pytest.mark.django_db
async def test_a_small_body_passes_through_to_django():
    sent, _ = await call(
        http_scope([(b"content-length", b"2"), (b"content-type", b"application/json")]), [b"{}"]
    )
    assert sent[0]["status"] == 401  # reached the API (unauthenticated)
