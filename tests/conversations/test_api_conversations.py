"""Conversations API: list, create, read, update, delete, history, session reset."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone
from rest_framework.test import APIClient

from conversations.models import Conversation, ConversationFile, Run, RunEvent
from conversations.selectors.workspaces import workspace_path
from conversations.services.workspaces import workspace_ensure
from teams.models import Access
from tests.factories import conversation_of, missing_id

pytestmark = pytest.mark.django_db


@pytest.fixture
def conversation(user):
    return conversation_of(user, title="sales")


def test_create_with_defaults_and_with_fields(api, settings, django_capture_on_commit_callbacks):
    settings.PAW_LLM_BASE_URL = "http://127.0.0.1:9/v1"  # the server default, active with a key
    settings.PAW_LLM_API_KEY = "sk-test"
    settings.PAW_LLM_MODEL = "gpt-x"
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post("/api/conversations", {}, format="json")
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["title"] == "" and body["auto_approve"] is False
    assert workspace_path(body["id"]).is_dir()
    response = api.post(
        "/api/conversations",
        {"title": "Q3", "auto_approve": True, "llm_provider": "default", "llm_model": "gpt-x"},
        format="json",
    )
    assert response.status_code == 201
    assert {k: response.json()[k] for k in ("title", "auto_approve", "llm_model")} == {
        "title": "Q3",
        "auto_approve": True,
        "llm_model": "gpt-x",
    }


@pytest.mark.parametrize(
    "body",
    [
        {"title": "x" * 201},
        {"title": ["a"]},
        {"auto_approve": "maybe"},
        {"llm_model": {"a": 1}},
        {"titel": "typo"},
        {"user": 1},
        {"id": "00000000-0000-0000-0000-000000000000"},
    ],
)
def test_create_bad_input_is_400_and_creates_nothing(api, body):
    response = api.post("/api/conversations", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["detail"] and response.json()["fields"]
    assert not Conversation.objects.exists()


def test_create_with_a_json_array_or_broken_json_is_400(api):
    assert api.post("/api/conversations", [1, 2], format="json").status_code == 400
    broken = api.generic("POST", "/api/conversations", b"{", content_type="application/json")
    assert broken.status_code == 400
    assert broken.json()["code"] == "parse_error"


def test_list_is_paginated_newest_activity_first_and_only_mine(api, user, other_user):
    now = timezone.now()
    for n in range(25):
        conversation_of(user, title=f"c{n}", last_activity_at=now - timedelta(minutes=n))
    conversation_of(other_user, title="not mine")
    response = api.get("/api/conversations")
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"next", "previous", "results"}
    assert [c["title"] for c in body["results"]] == [f"c{n}" for n in range(20)]
    assert body["next"] and body["previous"] is None
    rest = api.get(body["next"]).json()
    assert [c["title"] for c in rest["results"]] == [f"c{n}" for n in range(20, 25)]
    assert rest["next"] is None
    small = api.get("/api/conversations", {"page_size": 10}).json()
    assert [c["title"] for c in small["results"]] == [f"c{n}" for n in range(10)]
    assert api.get("/api/conversations", {"cursor": "garbage"}).status_code == 404


def test_list_pages_stay_consistent_when_activity_changes(api, user):
    now = timezone.now()
    for n in range(4):
        conversation_of(user, title=f"c{n}", last_activity_at=now - timedelta(minutes=n))
    first = api.get("/api/conversations", {"page_size": 2}).json()
    conversation_of(user, title="new", last_activity_at=now + timedelta(minutes=1))
    second = api.get(first["next"]).json()
    assert [c["title"] for c in second["results"]] == ["c2", "c3"]


def test_list_costs_a_fixed_number_of_queries(api, user, django_assert_max_num_queries):
    for n in range(10):
        conversation_of(user, title=f"c{n}")
    with django_assert_max_num_queries(2):  # the user (JWT check) and the page
        assert len(api.get("/api/conversations").json()["results"]) == 10


def test_retrieve_and_patch(api, conversation):
    url = f"/api/conversations/{conversation.id}"
    assert api.get(url).json()["title"] == "sales"
    response = api.patch(url, {"title": "renamed", "auto_approve": True}, format="json")
    assert response.status_code == 200
    assert response.json()["title"] == "renamed" and response.json()["auto_approve"] is True
    conversation.refresh_from_db()
    assert conversation.title == "renamed" and conversation.llm_model == ""


@pytest.mark.parametrize(
    "body", [{"auto_approve": "perhaps"}, {"title": None}, {"event_cursor": 5}, {"titel": "x"}]
)
def test_patch_bad_input_is_400_and_changes_nothing(api, conversation, body):
    response = api.patch(f"/api/conversations/{conversation.id}", body, format="json")
    assert response.status_code == 400
    conversation.refresh_from_db()
    assert conversation.title == "sales" and conversation.event_cursor == 0


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"llm_provider": "nope"}, "unknown_provider"),
        ({"llm_provider": "💥"}, "unknown_provider"),
        ({"llm_provider": "openai"}, "provider_inactive"),  # no key in the tests
        ({"llm_model": "gpt-x"}, "provider_required"),
    ],
)
def test_a_default_model_the_user_cannot_use_is_refused_when_set(api, conversation, body, code):
    patched = api.patch(f"/api/conversations/{conversation.id}", body, format="json")
    assert patched.status_code == 400, patched.json()
    assert patched.json()["code"] == code
    assert "the conversation's default" in patched.json()["detail"]
    conversation.refresh_from_db()
    assert (conversation.llm_provider, conversation.llm_model) == ("", "")
    created = api.post("/api/conversations", body, format="json")
    assert created.status_code == 400 and created.json()["code"] == code


def test_a_conversation_has_its_own_approval_timeout(api, conversation):
    url = f"/api/conversations/{conversation.id}"
    assert api.get(url).json()["approval_timeout_seconds"] is None  # the server default
    assert api.patch(url, {"approval_timeout_seconds": 600}, format="json").status_code == 200
    assert api.get(url).json()["approval_timeout_seconds"] == 600
    for bad in (5, 86_401, "soon", True):
        response = api.patch(url, {"approval_timeout_seconds": bad}, format="json")
        assert response.status_code == 400, bad
    conversation.refresh_from_db()
    assert conversation.approval_timeout_seconds == 600
    assert api.patch(url, {"approval_timeout_seconds": None}, format="json").status_code == 200
    conversation.refresh_from_db()
    assert conversation.approval_timeout_seconds is None
    created = api.post("/api/conversations", {"approval_timeout_seconds": 30}, format="json")
    assert created.status_code == 201 and created.json()["approval_timeout_seconds"] == 30


def test_a_conversation_keeps_its_datasources_and_its_runs_get_them(
    api, conversation, settings, scripted_model
):
    """The chat page's datasource picker: the conversation's `datasources` (checked like a
    run's) go with every run that names none; a run's own list (even `[]`) wins; one
    disabled since is left out of the next run."""
    from secrets_vault.models import Datasource
    from tests.conftest import SCRIPTED_API_KEY

    settings.PAW_LLM_BASE_URL = scripted_model.base_url
    settings.PAW_LLM_API_KEY = SCRIPTED_API_KEY
    settings.PAW_LLM_MODEL = "scripted-model"
    for slug in ("shop", "tips", "old"):
        Datasource.objects.create(
            slug=slug, name=slug.title(), dialect="sqlite", connection={"database": "x.db"},
            access=Access.EVERYONE,
        )  # fmt: skip
    url = f"/api/conversations/{conversation.id}"
    assert api.get(url).json()["datasources"] == []
    response = api.patch(url, {"datasources": ["tips", "shop", "tips"]}, format="json")
    assert response.status_code == 200 and response.json()["datasources"] == ["tips", "shop"]
    for bad in (["tips", "nope"], "tips", [1], ["x"] * 21):
        response = api.patch(url, {"datasources": bad}, format="json")
        assert response.status_code == 400, bad
        assert {"detail", "code"} <= set(response.json())
    assert api.patch(url, {"datasources": ["nope"]}, format="json").json()["code"] == (
        "unknown_datasource"
    )
    conversation.refresh_from_db()
    assert conversation.datasources == ["tips", "shop"]

    def start(body):
        response = api.post(f"{url}/runs", {"prompt": "how many?", **body}, format="json")
        assert response.status_code == 202, response.json()
        run = Run.objects.get(id=response.json()["id"])
        Run.objects.filter(id=run.id).update(status="done")  # the next one may start
        return run.datasources

    assert start({}) == ["tips", "shop"]
    assert start({"datasources": ["old"]}) == ["old"]
    assert start({"datasources": []}) == []
    Datasource.objects.filter(slug="shop").update(enabled=False)
    assert start({}) == ["tips"]
    created = api.post("/api/conversations", {"datasources": ["old"]}, format="json")
    assert created.status_code == 201 and created.json()["datasources"] == ["old"]
    refused = api.post("/api/conversations", {"datasources": ["shop"]}, format="json")
    assert refused.status_code == 400 and refused.json()["code"] == "unknown_datasource"


def test_other_users_conversation_is_404_everywhere(other_api, conversation):
    base = f"/api/conversations/{conversation.id}"
    assert other_api.get(base).status_code == 404
    assert other_api.patch(base, {"title": "mine now"}, format="json").status_code == 404
    assert other_api.delete(base).status_code == 404
    assert other_api.get(f"{base}/history").status_code == 404
    assert other_api.delete(f"{base}/session").status_code == 404
    assert other_api.get(f"{base}/events").status_code == 404
    assert other_api.get(f"{base}/artifacts").status_code == 404
    conversation.refresh_from_db()
    assert conversation.title == "sales" and conversation.memory_since is None


@pytest.mark.parametrize(
    "path", ["/api/conversations/not-a-uuid", "/api/conversations/123", "/api/conversations/%00"]
)
def test_bad_uuid_is_a_json_404(api, path):
    response = api.get(path)
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


def test_unknown_conversation_is_404(api):
    assert api.get(f"/api/conversations/{missing_id()}").status_code == 404


def test_unauthenticated_is_401():
    assert APIClient().get("/api/conversations").status_code == 401


def test_delete_removes_everything_and_the_workspace(
    api, user, conversation, django_capture_on_commit_callbacks
):
    folder = workspace_ensure(conversation.id)
    (folder / "sub").mkdir()
    (folder / "sub" / "chart.png").write_bytes(b"png")
    ConversationFile.objects.create(conversation=conversation, name="a.csv", size=1, sha256="0")
    run = Run.objects.create(conversation=conversation, user=user, prompt="hi", status="done")
    RunEvent.objects.create(conversation=conversation, run=run, cursor=1, type="start")
    with django_capture_on_commit_callbacks(execute=True):
        response = api.delete(f"/api/conversations/{conversation.id}")
    assert response.status_code == 204
    assert not Conversation.objects.filter(pk=conversation.id).exists()
    assert not Run.objects.exists() and not RunEvent.objects.exists()
    assert not folder.exists()
    assert api.get(f"/api/conversations/{conversation.id}").status_code == 404


def test_history_lists_turns_oldest_first(api, user, conversation):
    first = Run.objects.create(
        conversation=conversation, user=user, prompt="one", answer="1", status="done"
    )
    Run.objects.create(conversation=conversation, user=user, prompt="two", status="running")
    response = api.get(f"/api/conversations/{conversation.id}/history")
    assert response.status_code == 200
    turns = response.json()["results"]
    assert [(t["prompt"], t["answer"], t["status"]) for t in turns] == [
        ("one", "1", "done"),
        ("two", "", "running"),
    ]
    assert turns[0]["run_id"] == str(first.id)
    assert set(turns[0]) >= {"created", "started", "finished", "in_memory"}


def test_session_reset_forgets_memory_but_keeps_the_transcript(
    api, user, conversation, django_capture_on_commit_callbacks
):
    Run.objects.create(conversation=conversation, user=user, prompt="one", status="done")
    with django_capture_on_commit_callbacks(execute=True):
        response = api.delete(f"/api/conversations/{conversation.id}/session")
    assert response.status_code == 204
    conversation.refresh_from_db()
    assert conversation.memory_since is not None
    Run.objects.create(conversation=conversation, user=user, prompt="two", status="done")
    turns = api.get(f"/api/conversations/{conversation.id}/history").json()["results"]
    assert [(t["prompt"], t["in_memory"]) for t in turns] == [("one", False), ("two", True)]


def test_session_reset_while_a_run_is_active_is_409(api, user, conversation):
    Run.objects.create(conversation=conversation, user=user, prompt="busy", status="running")
    response = api.delete(f"/api/conversations/{conversation.id}/session")
    assert response.status_code == 409
    assert response.json()["code"] == "run_active"
    conversation.refresh_from_db()
    assert conversation.memory_since is None


def test_fast_conversation_output_equals_drfs_generic_field_output(user):
    from rest_framework import serializers

    from conversations.api.conversations import ConversationOutput

    conversation = conversation_of(user, title="é", memory_since=timezone.now())
    generic = serializers.ModelSerializer.to_representation(ConversationOutput(), conversation)
    assert ConversationOutput(conversation).data == dict(generic)
    conversation.memory_since = None
    generic = serializers.ModelSerializer.to_representation(ConversationOutput(), conversation)
    assert ConversationOutput(conversation).data == dict(generic)


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000)
def test_an_oversized_json_body_is_a_clear_413_and_creates_nothing(api):
    response = api.post("/api/conversations", {"title": "x" * 2000}, format="json")
    assert response.status_code == 413
    assert response.json()["code"] == "payload_too_large"
    assert not Conversation.objects.exists()


def test_multipart_is_refused_where_no_file_is_expected(api):
    response = api.post("/api/conversations", {"title": "x"}, format="multipart")
    assert response.status_code == 415
    assert not Conversation.objects.exists()


@override_settings(DATA_UPLOAD_MAX_NUMBER_FIELDS=3)
def test_too_many_form_fields_in_an_upload_is_a_400(api, conversation):
    parts = "".join(
        f'--b\r\nContent-Disposition: form-data; name="f{n}"\r\n\r\nv\r\n' for n in range(10)
    )
    response = api.generic(
        "POST",
        f"/api/conversations/{conversation.id}/files",
        f"{parts}--b--\r\n".encode(),
        content_type="multipart/form-data; boundary=b",
    )
    assert response.status_code == 400
    assert response.json()["code"] == "too_many_fields"
