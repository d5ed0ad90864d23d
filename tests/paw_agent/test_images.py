"""Images to the model: paw-agent sends a submit's attachments and what view_image shows
as image content parts, checked by the scripted model byte for byte; and refuses, clearly,
what cannot be sent."""

from __future__ import annotations

import hashlib

import pytest

from tests.images import JPEG_BYTES, WEBP_BYTES, png_bytes
from tests.paw_agent.conftest import API_KEY
from tests.paw_agent.driver import notifies, of_type


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def result_of(lines):
    return of_type(lines, "result")[0]


def test_ready_offers_the_images_capability(start):
    assert "images" in start("paw-agent").ready()["capabilities"]


def test_an_attached_png_reaches_the_model_as_an_image_part_of_the_prompt(start, model, workspace):
    image = png_bytes(5, 4)
    (workspace / "photo.png").write_bytes(image)
    model.load(
        {
            "api_key": API_KEY,
            "responses": [{"text": "I see {{images}}", "expect_images": [sha(image)]}],
        }
    )
    runtime = start("paw-agent")
    runtime.ready()
    lines = runtime.submit(
        "What is in this picture?", attachments=[{"path": "photo.png"}], vision=True
    )
    assert of_type(lines, "start")[0]["attachments"] == ["photo.png"]
    result = result_of(lines)
    assert result["errors"] == []
    assert result["answer"] == f"I see image/png, {len(image)} bytes, sha256 {sha(image)}"
    [entry] = model.log
    assert "expectation_failed" not in entry
    assert entry["images"] == [
        {
            "message": len(entry["body"]["messages"]) - 1,
            "role": "user",
            "media_type": "image/png",
            "bytes": len(image),
            "sha256": sha(image),
        }
    ]
    # The prompt's own user message: its text first, then the image, as OpenAI takes it.
    text, part = entry["body"]["messages"][-1]["content"]
    assert text == {"type": "text", "text": "What is in this picture?"}
    assert part["type"] == "image_url"
    assert part["image_url"]["url"].startswith("data:image/png;base64,")
    # The image counts for a fixed size, not its base64 length, in the usage estimate.
    assert result["usage"]["input"] < 5_000


def test_jpeg_and_webp_are_told_apart_by_their_bytes_not_their_names(start, model, workspace):
    (workspace / "a.png").write_bytes(JPEG_BYTES)  # a JPEG named .png
    (workspace / "b.bin").write_bytes(WEBP_BYTES)
    model.load({"api_key": API_KEY, "responses": ["{{images}}"]})
    runtime = start("paw-agent")
    runtime.ready()
    lines = runtime.submit(
        "Compare them", attachments=[{"path": "a.png"}, {"path": "b.bin"}], vision=True
    )
    assert result_of(lines)["answer"].splitlines() == [
        f"image/jpeg, {len(JPEG_BYTES)} bytes, sha256 {sha(JPEG_BYTES)}",
        f"image/webp, {len(WEBP_BYTES)} bytes, sha256 {sha(WEBP_BYTES)}",
    ]


def test_attachments_for_a_model_without_vision_fail_the_run_before_any_model_call(
    start, model, workspace
):
    (workspace / "photo.png").write_bytes(png_bytes())
    model.load({"api_key": API_KEY, "responses": ["never"]})
    runtime = start("paw-agent")
    runtime.ready()
    lines = runtime.submit("Describe", attachments=[{"path": "photo.png"}], vision=False)
    [error] = result_of(lines)["errors"]
    assert error["code"] == "model_without_vision"
    assert "does not accept images" in error["message"] and "photo.png" in error["message"]
    assert notifies(lines, "error") == [error["message"]]  # said in the chat, too
    assert model.log == []


@pytest.mark.parametrize(
    ("name", "content", "flags", "words"),
    [
        ("notes.png", b"just text, named like a picture", (), "is not a PNG, JPEG or WebP"),
        ("big.png", png_bytes(40, 40), ("--max-image-bytes", "100"), "more than the 100 bytes"),
        ("missing.png", None, (), "no image file 'missing.png'"),
        ("../outside.png", None, (), "'..' is not allowed"),
    ],
)
def test_an_attachment_that_cannot_be_sent_fails_the_run_clearly(
    start, model, workspace, name, content, flags, words
):
    if content is not None:
        (workspace / name).write_bytes(content)
    model.load({"api_key": API_KEY, "responses": ["never"]})
    runtime = start("paw-agent", *flags)
    runtime.ready()
    lines = runtime.submit("Describe", attachments=[{"path": name}], vision=True)
    [error] = result_of(lines)["errors"]
    assert error["code"] == "attachment"
    assert words in error["message"], error
    assert model.log == []


def test_a_malformed_attachments_field_is_refused_like_a_bad_submit(start):
    runtime = start("paw-agent")
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "hi", "run_id": "r1", "attachments": "a.png"})
    assert "attachments must be a list" in runtime.error()["error"]["message"]
    runtime.send({"op": "submit", "prompt": "hi", "run_id": "r2", "vision": "yes"})
    assert "vision must be true or false" in runtime.error()["error"]["message"]


def test_view_image_is_offered_only_to_a_vision_model_and_shows_the_image_next(
    start, model, workspace
):
    chart = png_bytes(8, 8, (10, 120, 10))
    (workspace / "chart.png").write_bytes(chart)
    model.load(
        {
            "api_key": API_KEY,
            "responses": [
                {"tool_calls": [{"name": "view_image", "arguments": {"path": "chart.png"}}]},
                {"text": "The chart: {{images}}", "expect_images": [sha(chart)]},
                "No images here.",
            ],
        }
    )
    runtime = start("paw-agent")
    runtime.ready()
    lines = runtime.submit("Look at chart.png", vision=True)
    assert (
        result_of(lines)["answer"]
        == f"The chart: image/png, {len(chart)} bytes, sha256 {sha(chart)}"
    )
    first, second = model.requests
    assert "view_image" in [t["function"]["name"] for t in first["tools"]]
    assert first["messages"][-1]["content"] == "Look at chart.png"  # no image before
    tool, shown = second["messages"][-2:]
    assert tool["role"] == "tool" and "chart.png" in tool["content"]
    assert shown["role"] == "user" and shown["content"][1]["type"] == "image_url"
    [call] = notifies(lines, "tool")
    assert call["ok"] and call["name"] == "view_image"

    lines = runtime.submit("And now?", run_id="run-2", vision=False)
    assert "view_image" not in [t["function"]["name"] for t in model.requests[2]["tools"]]
    # The memory says an image was shown in the earlier turn only through its answer.
    assert result_of(lines)["answer"] == "No images here."
