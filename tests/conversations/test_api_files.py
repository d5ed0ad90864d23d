"""Files API: streamed uploads into the workspace, names, limits, listing, download, delete."""

from __future__ import annotations

import unicodedata

import pytest
from django.test import override_settings
from rest_framework.test import APIClient

from conversations.models import ConversationFile
from conversations.selectors.workspaces import workspace_path
from conversations.services.workspaces import workspace_ensure
from tests.conversations.multipart import sha256, upload
from tests.factories import conversation_of, missing_id

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(user):
    return conversation_of(user, title="sales")


def workspace_names(conversation) -> set[str]:
    folder = workspace_path(conversation.id)
    return {path.name for path in folder.iterdir()} if folder.exists() else set()


def test_upload_returns_201_with_name_size_sha256_and_bytes_come_back_identical(api, conversation):
    content = bytes(range(256)) * 1000 + b"\r\n--not-a-boundary\r\n"
    response = upload(api, conversation.id, "tips.csv", content)
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == {"id", "name", "size", "sha256", "created"}
    assert body["name"] == "tips.csv"
    assert body["size"] == len(content)
    assert body["sha256"] == sha256(content)
    assert (workspace_path(conversation.id) / "tips.csv").read_bytes() == content
    download = api.get(f"/api/conversations/{conversation.id}/files/{body['id']}/content")
    assert download.status_code == 200
    assert b"".join(download.streaming_content) == content
    assert download["X-Content-Type-Options"] == "nosniff"
    assert download["Content-Disposition"].startswith("attachment;")
    assert "filename*=UTF-8''tips.csv" in download["Content-Disposition"]


def test_upload_leaves_no_staging_file_and_bumps_activity(api, conversation):
    before = conversation.last_activity_at
    upload(api, conversation.id, "a.txt", b"a")
    assert workspace_names(conversation) == {"a.txt"}
    conversation.refresh_from_db()
    assert conversation.last_activity_at > before


def test_empty_file_is_accepted(api, conversation):
    response = upload(api, conversation.id, "empty.txt", b"")
    assert response.status_code == 201
    assert response.json()["size"] == 0
    assert response.json()["sha256"] == sha256(b"")


@override_settings(PAW_MAX_UPLOAD_BYTES=1000)
def test_a_file_of_exactly_the_limit_is_accepted(api, conversation):
    response = upload(api, conversation.id, "limit.bin", b"x" * 1000)
    assert response.status_code == 201
    assert response.json()["size"] == 1000


@override_settings(PAW_MAX_UPLOAD_BYTES=1000)
def test_one_byte_over_the_limit_is_413_and_leaves_nothing(api, conversation):
    response = upload(api, conversation.id, "over.bin", b"x" * 1001)
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
    assert workspace_names(conversation) == set()
    assert not ConversationFile.objects.exists()


@override_settings(PAW_MAX_UPLOAD_BYTES=1000)
def test_a_large_content_length_is_refused_before_the_body_is_read(api, conversation):
    response = upload(api, conversation.id, "big.bin", b"x", CONTENT_LENGTH=str(10**9))
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
    assert workspace_names(conversation) == set()


@pytest.mark.parametrize(
    ("sent", "stored"),
    [
        ("données Q3 (final).xlsx", "données Q3 (final).xlsx"),
        (unicodedata.normalize("NFD", "données.csv"), "données.csv"),
        ("报表.csv", "报表.csv"),
        ("../../x.txt", "x.txt"),
        ("..\\..\\win.txt", "win.txt"),
        ("/etc/passwd", "passwd"),
        ("a\x00b.txt", "ab.txt"),
        ("tab\there\x1b.txt", "tabhere.txt"),
        ("evil\u202etxt.exe", "eviltxt.exe"),
        (".bashrc", "bashrc"),
        (".paw", "paw"),
        ("  spaced  .txt", "spaced  .txt"),
    ],
)
def test_names_keep_unicode_and_lose_paths_and_control_characters(api, conversation, sent, stored):
    response = upload(api, conversation.id, sent, b"data")
    assert response.status_code == 201, response.content
    assert response.json()["name"] == stored
    assert (workspace_path(conversation.id) / stored).read_bytes() == b"data"
    assert workspace_names(conversation) == {stored}


def test_a_very_long_name_is_shortened_keeping_its_extension(api, conversation):
    response = upload(api, conversation.id, "é" * 300 + ".csv", b"data")
    assert response.status_code == 201
    name = response.json()["name"]
    assert name.endswith(".csv") and len(name.encode()) <= 240
    assert (workspace_path(conversation.id) / name).exists()


def test_a_taken_name_gets_a_numbered_suffix(api, conversation):
    names = [upload(api, conversation.id, "tips.csv", bytes([n])).json()["name"] for n in range(3)]
    assert names == ["tips.csv", "tips (1).csv", "tips (2).csv"]
    assert (workspace_path(conversation.id) / "tips (2).csv").read_bytes() == b"\x02"


def test_an_upload_never_overwrites_a_file_the_agent_made(api, conversation):
    folder = workspace_ensure(conversation.id)
    (folder / "report.csv").write_bytes(b"agent output")
    response = upload(api, conversation.id, "report.csv", b"user data")
    assert response.json()["name"] == "report (1).csv"
    assert (folder / "report.csv").read_bytes() == b"agent output"


def test_an_upload_the_agent_deleted_leaves_the_list_and_frees_its_name(api, conversation):
    upload(api, conversation.id, "old.csv", b"first")
    upload(api, conversation.id, "kept.csv", b"kept")
    (workspace_path(conversation.id) / "old.csv").unlink()  # what an approved delete_file does
    listed = api.get(f"/api/conversations/{conversation.id}/files").json()["results"]
    assert [item["name"] for item in listed] == ["kept.csv"]
    again = upload(api, conversation.id, "old.csv", b"second").json()
    assert again["name"] == "old.csv"  # not "old (1).csv": the name is free again
    assert (workspace_path(conversation.id) / "old.csv").read_bytes() == b"second"
    assert ConversationFile.objects.filter(conversation=conversation).count() == 2


def test_list_files_oldest_first(api, conversation):
    upload(api, conversation.id, "b.txt", b"b")
    upload(api, conversation.id, "a.txt", b"a")
    response = api.get(f"/api/conversations/{conversation.id}/files")
    assert response.status_code == 200
    assert [item["name"] for item in response.json()["results"]] == ["b.txt", "a.txt"]


def test_delete_removes_record_and_file(api, conversation, django_capture_on_commit_callbacks):
    file_id = upload(api, conversation.id, "a.txt", b"a").json()["id"]
    with django_capture_on_commit_callbacks(execute=True):
        response = api.delete(f"/api/conversations/{conversation.id}/files/{file_id}")
    assert response.status_code == 204
    assert workspace_names(conversation) == set()
    assert not ConversationFile.objects.exists()
    assert api.delete(f"/api/conversations/{conversation.id}/files/{file_id}").status_code == 404


def test_download_of_an_upload_replaced_by_a_symlink_out_is_404(
    api, conversation, tmp_path, django_capture_on_commit_callbacks
):
    file_id = upload(api, conversation.id, "a.txt", b"a").json()["id"]
    secret = tmp_path / "secret.txt"
    secret.write_text("server secret")
    target = workspace_path(conversation.id) / "a.txt"
    target.unlink()
    target.symlink_to(secret)
    response = api.get(f"/api/conversations/{conversation.id}/files/{file_id}/content")
    assert response.status_code == 404
    with django_capture_on_commit_callbacks(execute=True):
        api.delete(f"/api/conversations/{conversation.id}/files/{file_id}")
    assert not target.is_symlink()
    assert secret.read_text() == "server secret"  # the link went, not its target


def test_other_users_conversation_is_404_and_nothing_is_written(other_api, api, conversation):
    response = upload(other_api, conversation.id, "x.txt", b"x")
    assert response.status_code == 404
    assert workspace_names(conversation) == set()
    file_id = upload(api, conversation.id, "mine.txt", b"m").json()["id"]
    base = f"/api/conversations/{conversation.id}/files"
    assert other_api.get(base).status_code == 404
    assert other_api.get(f"{base}/{file_id}/content").status_code == 404
    assert other_api.delete(f"{base}/{file_id}").status_code == 404
    assert ConversationFile.objects.filter(pk=file_id).exists()


def test_a_file_id_of_another_conversation_is_404(api, user, conversation):
    second = conversation_of(user)
    file_id = upload(api, conversation.id, "a.txt", b"a").json()["id"]
    response = api.delete(f"/api/conversations/{second.id}/files/{file_id}")
    assert response.status_code == 404


def test_unknown_conversation_and_bad_ids_are_404(api):
    assert upload(api, missing_id(), "x.txt", b"x").status_code == 404
    assert api.get("/api/conversations/not-a-uuid/files").status_code == 404
    assert api.get(f"/api/conversations/{missing_id()}/files/123/content").status_code == 404


def test_no_file_part_is_400(api, conversation):
    response = upload(api, conversation.id, "x.txt", b"x", **{})  # right shape first
    assert response.status_code == 201
    wrong_field = api.generic(
        "POST",
        f"/api/conversations/{conversation.id}/files",
        b"--b\r\n"
        b'Content-Disposition: form-data; name="other"; filename="y.txt"\r\n\r\n'
        b"y\r\n--b--\r\n",
        content_type="multipart/form-data; boundary=b",
    )
    assert wrong_field.status_code == 400
    assert wrong_field.json()["code"] == "required"
    assert workspace_names(conversation) == {"x.txt"}


def test_two_file_parts_are_400_and_leave_nothing(api, conversation):
    part = b'--b\r\nContent-Disposition: form-data; name="file"; filename="t.csv"\r\n\r\na,b\r\n'
    response = api.generic(
        "POST",
        f"/api/conversations/{conversation.id}/files",
        part + part + b"--b--\r\n",
        content_type="multipart/form-data; boundary=b",
    )
    assert response.status_code == 400, response.content
    assert response.json()["code"] == "invalid"
    assert "one file per request" in response.json()["detail"]
    assert workspace_names(conversation) == set()
    assert not ConversationFile.objects.filter(conversation=conversation).exists()


def test_json_instead_of_multipart_is_415(api, conversation):
    response = api.post(f"/api/conversations/{conversation.id}/files", {"file": "x"}, format="json")
    assert response.status_code == 415


def test_unauthenticated_upload_is_401(conversation):
    assert upload(APIClient(), conversation.id, "x.txt", b"x").status_code == 401
    assert workspace_names(conversation) == set()


def test_session_upload_without_csrf_is_403_and_leaves_no_partial_file(user, conversation):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    # With the cookie but no token, Django's CSRF check reads the form body looking for one,
    # so the file is received before the request is refused.
    client.cookies["csrftoken"] = "a" * 32
    response = upload(client, conversation.id, "x.txt", b"x" * 10_000)
    assert response.status_code == 403
    assert [n for n in workspace_names(conversation)] == []


def test_session_upload_with_csrf_works(user, conversation):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    client.cookies["csrftoken"] = token = "a" * 32
    response = upload(client, conversation.id, "x.txt", b"x", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 201, response.content


@override_settings(PAW_THROTTLE_UPLOADS="2/min")
def test_uploads_are_throttled_per_user_with_retry_after(api, other_api, conversation, other_user):
    for name in ("a.txt", "b.txt"):
        assert upload(api, conversation.id, name, b"x").status_code == 201
    response = upload(api, conversation.id, "c.txt", b"x")
    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    assert "c.txt" not in workspace_names(conversation)
    # Listing is not counted, and the limit is per user.
    assert api.get(f"/api/conversations/{conversation.id}/files").status_code == 200
    theirs = conversation_of(other_user)
    assert upload(other_api, theirs.id, "a.txt", b"x").status_code == 201


def test_the_files_list_is_paginated_like_runs_and_approvals(api, conversation):
    """``page`` and ``page_size`` (PawPagination: default 20, at most 100) → ``{count,
    next, previous, results}``; a page past the end answers 404."""
    folder = workspace_ensure(conversation.id)
    for n in range(23):
        (folder / f"f{n:02}.txt").write_text(str(n))
        ConversationFile.objects.create(
            conversation=conversation, name=f"f{n:02}.txt", size=len(str(n)), sha256="0"
        )
    base = f"/api/conversations/{conversation.id}/files"
    first = api.get(base).json()
    assert first["count"] == 23 and first["previous"] is None
    assert [f["name"] for f in first["results"]] == [f"f{n:02}.txt" for n in range(20)]
    second = api.get(first["next"]).json()
    assert [f["name"] for f in second["results"]] == ["f20.txt", "f21.txt", "f22.txt"]
    assert second["next"] is None
    small = api.get(base, {"page_size": 5, "page": 2}).json()
    assert [f["name"] for f in small["results"]] == [f"f{n:02}.txt" for n in range(5, 10)]
    assert len(api.get(base, {"page_size": 1000}).json()["results"]) == 23  # capped at 100
    assert api.get(base, {"page": 9}).status_code == 404
