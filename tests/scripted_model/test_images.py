"""The scripted model's view of images: it decodes every image content part it receives
(``log[...]["images"]``), says what it got (``{{images}}``) and refuses, with HTTP 400, a
request whose images are not the ones its step expects (``expect_images``)."""

from __future__ import annotations

import base64
import hashlib

import openai
import pytest

from scripted_model import ScriptedModel, ScriptError
from scripted_model.script import Script
from tests.images import JPEG_BYTES, png_bytes

PNG = png_bytes(3, 2)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def with_image(text: str, data: bytes, media_type: str = "image/png") -> dict:
    url = f"data:{media_type};base64,{base64.b64encode(data).decode()}"
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": text},
            {"type": "image_url", "image_url": {"url": url}},
        ],
    }


def ask(model: ScriptedModel, messages: list[dict], stream: bool = False) -> str:
    client = openai.OpenAI(base_url=model.base_url, api_key="x", max_retries=0, timeout=10)
    if stream:
        chunks = client.chat.completions.create(
            model="scripted-model", messages=messages, stream=True
        )
        return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reply = client.chat.completions.create(model="scripted-model", messages=messages)
    return reply.choices[0].message.content


def test_images_received_are_logged_decoded_and_described():
    script = [
        {"text": "{{prompt}}: {{images}}", "expect_images": [digest(PNG), digest(JPEG_BYTES)]}
    ]
    with ScriptedModel(script) as model:
        answer = ask(model, [with_image("two", PNG), with_image("more", JPEG_BYTES, "image/jpeg")])
        [entry] = model.log
    assert answer.splitlines() == [
        f"more: image/png, {len(PNG)} bytes, sha256 {digest(PNG)}",
        f"image/jpeg, {len(JPEG_BYTES)} bytes, sha256 {digest(JPEG_BYTES)}",
    ]
    assert [(i["message"], i["media_type"], i["bytes"]) for i in entry["images"]] == [
        (0, "image/png", len(PNG)),
        (1, "image/jpeg", len(JPEG_BYTES)),
    ]
    assert "expectation_failed" not in entry


@pytest.mark.parametrize("stream", [False, True])
def test_a_missing_or_different_image_is_a_400_naming_both(stream):
    with ScriptedModel(
        {"responses": [{"text": "seen", "expect_images": [digest(PNG)], "times": 3}]}
    ) as model:
        with pytest.raises(openai.BadRequestError) as refused:
            ask(model, [{"role": "user", "content": "no image at all"}], stream)
        assert digest(PNG) in str(refused.value) and "received []" in str(refused.value)
        with pytest.raises(openai.BadRequestError) as different:
            ask(model, [with_image("wrong", PNG + b"!")], stream)
        assert digest(PNG + b"!") in str(different.value)
        assert ask(model, [with_image("right", PNG)], stream) == "seen"
        log = model.log
    assert [("expectation_failed" in e, e["status"]) for e in log] == [
        (True, 400),
        (True, 400),
        (False, 200),
    ]


def test_expecting_no_image_refuses_one_and_images_cost_fixed_tokens():
    big = PNG + bytes(range(256)) * 40  # 10 KiB past a PNG header
    with ScriptedModel([{"text": "x", "expect_images": []}, "y"]) as model:
        with pytest.raises(openai.BadRequestError):
            ask(model, [with_image("sneaky", PNG)])
        client = openai.OpenAI(base_url=model.base_url, api_key="x", max_retries=0)
        reply = client.chat.completions.create(
            model="scripted-model", messages=[with_image("big", big)]
        )
    assert len(base64.b64encode(big)) > 4 * 1500
    assert reply.usage.prompt_tokens < 1100  # 1,000 for the image, not its base64 length


def test_a_malformed_expectation_is_a_script_error():
    with pytest.raises(ScriptError, match="expect_images"):
        Script.parse([{"text": "x", "expect_images": "abc"}])
