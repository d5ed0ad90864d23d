"""Images to the model in the browser: upload a PNG, attach it to the message with the
files panel's toggle, ask about it; the scripted model checks it received the very bytes
uploaded. A model without vision is refused, saying so, before anything runs."""

from __future__ import annotations

import hashlib
import json

import pytest

from conversations.models import Run
from secrets_vault.models import CustomProvider
from secrets_vault.services import custom_provider_save
from tests.conversations.test_chat_page import (
    alice,
    ask,
    assert_no_page_errors,
    chat,
    conversation_of_page,
    wait_until_idle,
)
from tests.images import png_bytes

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]
__all__ = ["alice", "chat"]  # fixtures

PHOTO = png_bytes(24, 16, (250, 160, 20))


def test_upload_a_png_attach_it_and_ask_about_it(chat, scripted_model, tmp_path):
    custom_provider_save(
        provider=CustomProvider(
            name="eyes",
            label="Eyes",
            base_url=scripted_model.base_url,
            known_models=["scripted-model"],
            vision=True,
        )
    )
    digest = hashlib.sha256(PHOTO).hexdigest()
    scripted_model.load(
        {"responses": [{"text": "I received {{images}}.", "expect_images": [digest]}]}
    )
    scripted_model.clear_log()
    page = chat.page
    page.reload()  # the model picker lists the new provider
    page.wait_for_selector(".connection[data-state=connected]")
    # The page has the providers' list (what it knows of vision) before the image is attached.
    page.wait_for_selector("#model-picker optgroup[label=Eyes] option", state="attached")
    photo = tmp_path / "photo.png"
    photo.write_bytes(PHOTO)
    page.set_input_files("#file-input", str(photo))
    page.wait_for_selector("#file-chips .chip:has-text('photo.png')")
    conversation = conversation_of_page(page)

    attach = page.get_by_role("button", name="Attach photo.png to the message")
    attach.click()
    assert (
        page.get_by_role("button", name="Detach photo.png from the message").get_attribute(
            "aria-pressed"
        )
        == "true"
    )
    page.wait_for_selector("#attachment-tray .chip:has-text('photo.png')")
    # The automatic choice is the server default, whose model takes no images: said at
    # once, and the server refuses the message rather than sending it without the image.
    page.wait_for_selector("#attachment-note:has-text('does not accept images')", timeout=5000)
    ask(page, "What colour is this picture?")
    # The server's refusal (naming the image) takes the warning's place: said once.
    refused = page.locator(
        ":is(#attachment-note, #composer-error)", has_text="cannot be sent to it"
    )
    refused.first.wait_for()
    said = page.locator(":is(.composer-error, [role=alert], [role=status]):visible")
    assert said.filter(has_text="does not accept images").all_inner_texts() == [
        refused.first.inner_text()
    ]
    refusal = page.locator("#attachment-note")
    assert "does not accept images" in refusal.inner_text()
    assert "photo.png" in refusal.inner_text()
    assert page.locator("#composer-error").is_hidden()
    assert not Run.objects.filter(conversation=conversation).exists()
    assert scripted_model.log == []

    # A model that accepts images: the warning goes, the image goes with the message.
    page.select_option(
        "#model-picker", json.dumps(["eyes", "scripted-model"], separators=(",", ":"))
    )
    page.wait_for_function("() => document.getElementById('attachment-note').hidden")
    page.locator("#send").click()
    answer = page.locator(".answer").last
    answer.wait_for(timeout=60_000)
    wait_until_idle(page)
    assert f"sha256 {digest}" in answer.inner_text()
    assert f"image/png, {len(PHOTO)} bytes" in answer.inner_text()
    bubble = page.locator(".prompt-bubble").last
    assert "Images sent to the model: photo.png" in bubble.inner_text()
    assert page.locator("#attachment-tray").is_hidden()  # sent: the tray is empty again
    assert (
        page.get_by_role("button", name="Attach photo.png to the message").get_attribute(
            "aria-pressed"
        )
        == "false"
    )
    run = Run.objects.get(conversation=conversation)
    assert run.provider == "eyes" and run.attachments == ["photo.png"]
    [entry] = scripted_model.log
    assert "expectation_failed" not in entry
    assert [(i["media_type"], i["sha256"]) for i in entry["images"]] == [("image/png", digest)]

    # After a reload the prompt still says which image went with it.
    page.reload()
    page.wait_for_selector(".prompt-bubble:has-text('Images sent to the model: photo.png')")
    assert_no_page_errors(chat, allow=("400",))
