"""Artifacts API: listing what the agent made; downloads that cannot leave the workspace."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from conversations.models import ConversationFile
from conversations.services.workspaces import workspace_ensure
from tests.factories import conversation_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(user):
    return conversation_of(user)


@pytest.fixture
def workspace(conversation, tmp_path):
    folder = workspace_ensure(conversation.id)
    (folder / "report.csv").write_text("a,b\n1,2\n")
    (folder / "charts").mkdir()
    (folder / "charts" / "tips.png").write_bytes(b"\x89PNG\r\n\x1a\nfake")
    (folder / "page.html").write_text("<script>alert(1)</script>")
    (folder / "données Q3.txt").write_text("é")
    (folder / ".paw" / "home").mkdir(parents=True)
    (folder / ".paw" / "home" / "token").write_text("private")
    (folder / ".hidden.txt").write_text("private")
    (folder / "uploaded.csv").write_text("user data")
    ConversationFile.objects.create(
        conversation=conversation, name="uploaded.csv", size=9, sha256="0"
    )
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("server secret")
    (folder / "escape.txt").symlink_to(outside / "secret.txt")
    (folder / "escape_dir").symlink_to(outside)
    (folder / "private_link").symlink_to(folder / ".paw" / "home" / "token")
    (folder / "inner_link.csv").symlink_to(folder / "report.csv")
    return folder


def url(conversation, path: str = "") -> str:
    base = f"/api/conversations/{conversation.id}/artifacts"
    return f"{base}/{path}" if path else base


def test_list_is_recursive_and_leaves_out_uploads_private_parts_and_escapes(
    api, conversation, workspace
):
    response = api.get(url(conversation))
    assert response.status_code == 200
    items = {item["path"]: item for item in response.json()["results"]}
    assert set(items) == {
        "report.csv",
        "charts/tips.png",
        "page.html",
        "données Q3.txt",
        "inner_link.csv",
    }
    assert items["charts/tips.png"]["content_type"] == "image/png"
    assert items["report.csv"]["size"] == 8
    assert items["report.csv"]["modified"]


def test_an_upload_the_agent_rewrote_is_listed_as_its_artifact(api, conversation, workspace):
    """Same name, other bytes: the agent's chart.png over an upload named chart.png is what
    the workspace holds now, so it is listed (and an untouched upload still is not)."""
    (workspace / "uploaded.csv").write_text("the agent's rewrite, longer")
    items = {item["path"]: item for item in api.get(url(conversation)).json()["results"]}
    assert items["uploaded.csv"]["size"] == len("the agent's rewrite, longer")


def test_an_upload_rewritten_to_the_same_size_later_is_listed(api, conversation, workspace):
    upload = ConversationFile.objects.get(conversation=conversation)
    (workspace / "uploaded.csv").write_text("USER DATA")  # 9 bytes, like the upload
    later = (upload.created_at + timedelta(seconds=30)).timestamp()
    os.utime(workspace / "uploaded.csv", (later, later))
    assert "uploaded.csv" in {item["path"] for item in api.get(url(conversation)).json()["results"]}


def test_names_no_download_could_serve_are_not_listed(api, conversation, workspace):
    (workspace / "back\\slash.txt").write_text("x")
    (workspace / "new\nline.txt").write_text("x")
    (workspace / "tab\tname.txt").write_text("x")
    listed = {item["path"] for item in api.get(url(conversation)).json()["results"]}
    assert not any("\\" in path or "\n" in path or "\t" in path for path in listed)
    for path in ("back%5Cslash.txt", "new%0Aline.txt", "tab%09name.txt"):
        assert api.get(url(conversation, path)).status_code == 404


def test_empty_or_missing_workspace_lists_nothing(api, conversation):
    assert api.get(url(conversation)).json()["results"] == []


def test_download_is_an_attachment_with_rfc6266_name_and_nosniff(api, conversation, workspace):
    response = api.get(url(conversation, "données Q3.txt"))
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == "é".encode()
    disposition = response["Content-Disposition"]
    assert disposition.startswith("attachment;")
    assert "filename*=UTF-8''donn%C3%A9es%20Q3.txt" in disposition
    assert 'filename="donn_es Q3.txt"' in disposition
    assert response["X-Content-Type-Options"] == "nosniff"


def test_nested_path_and_inner_symlink_download(api, conversation, workspace):
    assert api.get(url(conversation, "charts/tips.png")).status_code == 200
    inner = api.get(url(conversation, "inner_link.csv"))
    assert b"".join(inner.streaming_content) == b"a,b\n1,2\n"


def test_inline_only_for_raster_images(api, conversation, workspace):
    image = api.get(url(conversation, "charts/tips.png"), {"inline": "1"})
    assert image["Content-Disposition"].startswith("inline;")
    assert image["Content-Type"] == "image/png"
    html = api.get(url(conversation, "page.html"), {"inline": "1"})
    assert html.status_code == 200
    assert html["Content-Disposition"].startswith("attachment;")
    assert "sandbox" in html["Content-Security-Policy"]


@pytest.mark.parametrize("name", ["evil.js", "evil.mjs", "style.css", "code.wasm"])
def test_what_a_page_could_run_or_apply_is_sent_as_plain_text(api, conversation, name):
    """The chat page allows scripts from PAW's origin: an agent-written script served as
    JavaScript would be one (an adversarial trial ran `alert` that way)."""
    folder = workspace_ensure(conversation.id)
    (folder / name).write_bytes(b"alert(1)")
    response = api.get(url(conversation, name))
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert (
        response["Content-Disposition"].startswith("attachment;")
        and name in response["Content-Disposition"]
    )
    listed = {a["path"]: a["content_type"] for a in api.get(url(conversation)).json()["results"]}
    assert listed[name] != "text/plain; charset=utf-8"  # the listing keeps the real type


@pytest.mark.parametrize(
    "path",
    [
        "../../../../etc/passwd",
        "charts/../../secret.txt",
        "%2e%2e/%2e%2e/etc/passwd",
        "..%2f..%2fetc%2fpasswd",
        "/etc/passwd",
        "%2fetc%2fpasswd",
        "escape.txt",
        "escape_dir/secret.txt",
        "private_link",
        ".paw/home/token",
        "%2epaw/home/token",
        ".hidden.txt",
        "charts",
        "nope.txt",
        "charts%00.png",
        "charts\\tips.png",
    ],
)
def test_traversal_attempts_are_404(api, conversation, workspace, path):
    response = api.get(url(conversation, path))
    assert response.status_code == 404, path
    assert response.json()["code"] == "not_found"


def test_a_symlinked_folder_swapped_in_is_not_followed(api, conversation, workspace, tmp_path):
    # A check-then-open race: the runtime replaces a real folder with a link out.
    os.rename(workspace / "charts", workspace / "charts.old")
    (workspace / "charts").symlink_to(tmp_path / "outside")
    (tmp_path / "outside" / "tips.png").write_bytes(b"outside")
    assert api.get(url(conversation, "charts/tips.png")).status_code == 404


def test_other_users_artifacts_are_404(other_api, conversation, workspace):
    assert other_api.get(url(conversation)).status_code == 404
    assert other_api.get(url(conversation, "report.csv")).status_code == 404


def test_bad_inline_value_is_400(api, conversation, workspace):
    assert api.get(url(conversation, "report.csv"), {"inline": "perhaps"}).status_code == 400


def test_the_artifacts_list_is_paginated_like_runs_and_approvals(api, conversation):
    """Sorted by path, ``page``/``page_size`` (PawPagination) → ``{count, next, previous,
    results}``; a page past the end answers 404."""
    folder = workspace_ensure(conversation.id)
    for n in range(25):
        (folder / f"out{n:02}.csv").write_text("a\n1\n")
    first = api.get(url(conversation)).json()
    assert first["count"] == 25 and first["previous"] is None
    assert [a["path"] for a in first["results"]] == [f"out{n:02}.csv" for n in range(20)]
    second = api.get(first["next"]).json()
    assert [a["path"] for a in second["results"]] == [f"out{n:02}.csv" for n in range(20, 25)]
    assert second["next"] is None and second["previous"]
    page = api.get(url(conversation), {"page_size": 10, "page": 3}).json()
    assert [a["path"] for a in page["results"]] == [f"out{n:02}.csv" for n in range(20, 25)]
    assert api.get(url(conversation), {"page": 4, "page_size": 10}).status_code == 404
