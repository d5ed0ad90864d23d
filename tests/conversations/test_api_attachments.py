"""Images to the model over the API: a run's ``attachments`` (uploaded images) reach the
model as image content parts, byte for byte (checked by the scripted model); a model
without vision, a file that is not an image, one too large or missing is refused with 400
and starts nothing."""

from __future__ import annotations

import hashlib

import pytest

from conversations.models import Run
from conversations.services.workspaces import workspace_ensure
from secrets_vault.models import CustomProvider
from secrets_vault.providers import models_cache_forget
from secrets_vault.services import custom_provider_save
from tests.conftest import SCRIPTED_API_KEY
from tests.conversations.multipart import upload
from tests.factories import conversation_of
from tests.images import JPEG_BYTES, WEBP_BYTES, png_bytes
from tests.live import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

PHOTO = png_bytes(6, 5, (30, 60, 200))


@pytest.fixture
def conversation(user):
    return conversation_of(user, title="Pictures")


@pytest.fixture
def configured(settings, scripted_model):
    """The default provider on the scripted model, its models accepting images."""
    settings.PAW_LLM_BASE_URL = scripted_model.base_url
    settings.PAW_LLM_API_KEY = SCRIPTED_API_KEY
    settings.PAW_LLM_MODEL = "scripted-model"
    settings.PAW_LLM_VISION = True


def start_run(api, conversation, **body):
    return api.post(
        f"/api/conversations/{conversation.id}/runs",
        {"prompt": "What is in the picture?", **body},
        format="json",
    )


def refused(response, code: str) -> dict:
    assert response.status_code == 400, response.json()
    body = response.json()
    assert body["code"] == code, body
    assert not Run.objects.exists()
    return body


def test_an_image_for_a_model_without_vision_is_refused_naming_the_model(
    api, conversation, configured, settings
):
    settings.PAW_LLM_VISION = False
    assert upload(api, conversation.id, "photo.png", PHOTO).status_code == 201
    body = refused(start_run(api, conversation, attachments=["photo.png"]), "model_without_vision")
    assert "'scripted-model'" in body["detail"] and "does not accept images" in body["detail"]
    assert "photo.png" in body["detail"]
    assert body["provider"] == "default" and body["model"] == "scripted-model"
    # Without the image the same model is fine.
    assert start_run(api, conversation).status_code == 202


@pytest.mark.parametrize(
    ("name", "content", "attach", "code"),
    [
        ("notes.png", b"a text file named like an image", "notes.png", "attachment_not_image"),
        ("tips.csv", b"day,tip\nSun,3\n", "tips.csv", "attachment_not_image"),
        ("photo.png", PHOTO, "other.png", "attachment_not_found"),
        ("photo.png", PHOTO, "../photo.png", "attachment_not_found"),
        ("photo.png", PHOTO, "/etc/passwd", "attachment_not_found"),
        ("photo.png", PHOTO, ".paw/home", "attachment_not_found"),
    ],
)
def test_what_is_not_an_image_of_the_workspace_is_refused(
    api, conversation, configured, name, content, attach, code
):
    assert upload(api, conversation.id, name, content).status_code == 201
    body = refused(start_run(api, conversation, attachments=[attach]), code)
    assert attach in body["detail"] or attach.lstrip("./") in body["detail"]


def test_an_image_over_the_limit_is_refused_with_the_limit(api, conversation, configured, settings):
    settings.PAW_MAX_IMAGE_BYTES = len(PHOTO) - 1
    assert upload(api, conversation.id, "photo.png", PHOTO).status_code == 201
    body = refused(start_run(api, conversation, attachments=["photo.png"]), "attachment_too_large")
    assert body["limit"] == len(PHOTO) - 1
    assert "PAW_MAX_IMAGE_BYTES" in body["detail"]
    settings.PAW_MAX_IMAGE_BYTES = len(PHOTO)
    assert start_run(api, conversation, attachments=["photo.png"]).status_code == 202


def test_jpeg_webp_and_made_files_are_accepted_and_kept_on_the_run(api, conversation, configured):
    upload(api, conversation.id, "a.jpg", JPEG_BYTES)
    upload(api, conversation.id, "b.webp", WEBP_BYTES)
    (workspace_ensure(conversation.id) / "chart.png").write_bytes(PHOTO)  # made by the agent
    response = start_run(api, conversation, attachments=["a.jpg", "b.webp", "chart.png", "a.jpg"])
    assert response.status_code == 202, response.json()
    assert response.json()["attachments"] == ["a.jpg", "b.webp", "chart.png"]
    assert Run.objects.get().attachments == ["a.jpg", "b.webp", "chart.png"]


def test_too_many_images_are_refused(api, conversation, configured):
    upload(api, conversation.id, "photo.png", PHOTO)
    response = start_run(api, conversation, attachments=["photo.png"] * 9)
    assert response.status_code == 400
    assert not Run.objects.exists()


def test_the_providers_list_says_which_models_accept_images(
    api, configured, settings, scripted_model
):
    settings.PAW_DEMO_BASE_URL = scripted_model.base_url
    # The server default lists the scripted model's live models: those of a script of
    # this test's (an earlier test's, the demo's, may be loaded and its list cached).
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "responses": []})
    models_cache_forget(base_url=scripted_model.base_url, api_key=SCRIPTED_API_KEY)
    custom_provider_save(
        provider=CustomProvider(
            name="eyes", base_url="http://127.0.0.1:9/v1", known_models=["llava"], vision=True
        )
    )
    custom_provider_save(
        provider=CustomProvider(
            name="blind", base_url="http://127.0.0.1:9/v1", known_models=["llama3.2"]
        )
    )
    providers = {p["name"]: p for p in api.get("/api/providers").json()["providers"]}
    assert providers["eyes"]["vision_models"] == ["llava"]
    assert providers["blind"]["vision_models"] == []
    assert providers["default"]["vision_models"] == ["scripted-model"]
    assert providers["openai"]["vision_models"] == ["gpt-5.4"]
    assert providers["demo"]["vision_models"] == []
    settings.PAW_LLM_VISION = False
    providers = {p["name"]: p for p in api.get("/api/providers").json()["providers"]}
    assert providers["default"]["vision_models"] == []


@pytest.mark.slow
def test_an_uploaded_image_reaches_the_model_byte_for_byte(
    api, conversation, celery_worker, scripted_model
):
    """End to end: upload, run with the image attached on a custom provider whose models
    accept images, paw-agent in the sandbox, the scripted model checking the image's
    SHA-256; a run on the default provider (no vision on the worker either) is refused."""
    custom_provider_save(
        provider=CustomProvider(
            name="eyes",
            base_url=scripted_model.base_url,
            known_models=["scripted-model"],
            vision=True,
        )
    )
    digest = hashlib.sha256(PHOTO).hexdigest()
    scripted_model.load(
        {"responses": [{"text": "Received {{images}}.", "expect_images": [digest]}]}
    )
    scripted_model.clear_log()  # the session's model: earlier tests' requests are not ours
    assert upload(api, conversation.id, "photo.png", PHOTO).status_code == 201
    response = start_run(api, conversation, attachments=["photo.png"], llm_provider="eyes")
    assert response.status_code == 202, response.json()
    run_url = f"/api/conversations/{conversation.id}/runs/{response.json()['id']}"
    done = wait_for(
        lambda: (r := api.get(run_url).json())["finished"] and r, what="run end", timeout=60
    )
    assert done["status"] == "done", done
    assert done["answer"] == f"Received image/png, {len(PHOTO)} bytes, sha256 {digest}."
    [entry] = scripted_model.log
    assert "expectation_failed" not in entry
    assert [(i["media_type"], i["sha256"]) for i in entry["images"]] == [("image/png", digest)]

    # The default provider's models do not accept images (PAW_LLM_VISION unset).
    refused_run = start_run(api, conversation, attachments=["photo.png"])
    assert refused_run.status_code == 400
    assert refused_run.json()["code"] == "model_without_vision"
