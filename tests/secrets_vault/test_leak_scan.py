"""The suite-wide secret scan cannot be vacuous: it records what the test clients,
websocket communicators and channel-layer listeners receive, knows the values stored
through the vault, registered for masking or used as sentinels, and fails a leaking test."""

from __future__ import annotations

import base64
import json
import secrets as pysecrets

import pytest
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from django.test import AsyncClient, Client

from secrets_vault.masking import secret_values_register
from secrets_vault.models import Secret
from secrets_vault.services import secret_set
from tests.conftest import SCRIPTED_API_KEY
from tests.secrets_vault.leak_scan import known_secret_values
from tests.secrets_vault.leaky_urls import LEAKY_URLCONF


@pytest.fixture
def leaky(settings):
    """The deliberately leaking views (``tests/secrets_vault/leaky_urls.py``) as the URL
    configuration."""
    settings.ROOT_URLCONF = LEAKY_URLCONF


def unremembered_value() -> str:
    """A value the scan has not been told about (unlike ``secret_value()``): only storing
    it through the vault can make it known."""
    return f"plain-{pysecrets.token_hex(12)}"


def leaked(scan) -> list[tuple[str, str]]:
    """``(where, value)`` of each leak the scan found so far; they are then forgotten, so
    the test itself does not fail for them."""
    return [(leak.where, leak.value) for leak in scan.take()]


@pytest.mark.parametrize("form", ["json", "html", "header", "stream", "file"])
@pytest.mark.django_db
def test_a_stored_secret_value_in_a_response_is_caught_in_every_form(secret_scan, leaky, form):
    value = unremembered_value()
    assert value not in known_secret_values()
    secret_set(name="LEAKY_KEY", value=value)
    assert value in known_secret_values(), "storing it through the vault made it known"
    response = Client().get(f"/leak/{form}/LEAKY_KEY/")
    assert response.status_code == 200
    assert leaked(secret_scan) == [(f"GET /leak/{form}/LEAKY_KEY/ (200)", value)]


@pytest.mark.django_db
def test_a_streamed_body_is_still_readable_after_the_scan_read_it(secret_scan, leaky):
    value = unremembered_value()
    secret_set(name="STREAMED_KEY", value=value)
    streamed = Client().get("/leak/stream/STREAMED_KEY/")
    assert streamed.streaming
    assert b"".join(streamed.streaming_content) == f"key={value}".encode()
    downloaded = Client().get("/leak/file/STREAMED_KEY/")
    assert downloaded.streaming and "dump.csv" in downloaded["Content-Disposition"]
    assert b"".join(downloaded.streaming_content) == f"a,b\n1,{value}\n".encode()
    assert {where for where, _ in leaked(secret_scan)} == {
        "GET /leak/stream/STREAMED_KEY/ (200)",
        "GET /leak/file/STREAMED_KEY/ (200)",
    }


@pytest.mark.django_db
def test_a_value_changed_with_a_bulk_update_is_known_too(secret_scan, leaky):
    secret, _ = secret_set(name="UPDATED_KEY", value=unremembered_value())
    value = unremembered_value()
    Secret.objects.filter(pk=secret.pk).update(value=value)  # no save(), no service
    Client().get("/leak/json/UPDATED_KEY/")
    assert [v for _, v in leaked(secret_scan)] == [value]


@pytest.mark.django_db
def test_the_drf_api_client_and_the_admin_are_scanned(secret_scan, leaky, admin_client):
    from rest_framework.test import APIClient

    value = unremembered_value()
    secret_set(name="API_LEAK", value=value)
    APIClient().get("/leak/json/API_LEAK/")
    admin_client.get("/leak/html/API_LEAK/")
    assert len(leaked(secret_scan)) == 2


def test_values_registered_for_masking_and_sentinels_are_known(secret_scan, leaky):
    registered = unremembered_value()
    secret_values_register({"REGISTERED_ONLY": registered})
    client = Client()
    for text in (registered, SCRIPTED_API_KEY, django_settings.SECRET_KEY):
        client.get("/echo/", {"text": text})
    assert [v for _, v in leaked(secret_scan)] == [
        registered,
        SCRIPTED_API_KEY,
        django_settings.SECRET_KEY,
    ]


def test_json_escaped_and_url_encoded_forms_are_caught(secret_scan, leaky):
    registered = f'quote"and/slash-{pysecrets.token_hex(8)}'
    secret_values_register({"ODD_VALUE": registered})
    client = Client()
    client.get("/echo/", {"text": json.dumps({"k": registered})})
    client.get(
        "/echo/", {"text": "next=/x?key=" + registered.replace("/", "%2F").replace('"', "%22")}
    )
    assert [v for _, v in leaked(secret_scan)] == [registered, registered]


@pytest.mark.parametrize(
    "encode",
    [
        lambda v: v[::-1],
        lambda v: base64.b64encode(v.encode()).decode(),
        lambda v: base64.urlsafe_b64encode(v.encode()).decode().rstrip("="),
        lambda v: v.encode().hex(),
        lambda v: v.encode().hex().upper(),
    ],
    ids=["reversed", "base64", "base64-urlsafe-unpadded", "hex", "HEX"],
)
def test_the_encoded_forms_masking_covers_are_caught(secret_scan, leaky, encode):
    registered = f"form?>>-{pysecrets.token_hex(8)}"
    secret_values_register({"FORM_VALUE": registered})
    Client().get("/echo/", {"text": f"printed {encode(registered)} here"})
    assert [v for _, v in leaked(secret_scan)] == [registered]


@pytest.mark.django_db
def test_a_masked_answer_is_recorded_and_passes(secret_scan, leaky):
    secret_set(name="FINE_KEY", value=unremembered_value())
    response = Client().get("/masked/FINE_KEY/")
    assert response.json() == {"value": "[secret:FINE_KEY]"}
    assert secret_scan.recorded()[-1] == "GET /masked/FINE_KEY/ (200)"
    assert leaked(secret_scan) == []


async def test_the_async_client_is_scanned(secret_scan, leaky):
    registered = unremembered_value()
    secret_values_register({"ASYNC_LEAK": registered})
    response = await AsyncClient().get("/echo/", {"text": registered})
    assert response.status_code == 200
    assert [v for _, v in leaked(secret_scan)] == [registered]


def leaky_websocket(value: str):
    """An ASGI websocket app that accepts and sends ``value`` in a JSON message."""

    async def app(scope, receive, send):
        await receive()
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.send", "text": json.dumps({"key": value})})
        await receive()

    return app


async def test_websocket_messages_are_scanned(secret_scan):
    registered = unremembered_value()
    secret_values_register({"WS_LEAK": registered})
    communicator = WebsocketCommunicator(leaky_websocket(registered), "/ws/leaky/")
    connected, _ = await communicator.connect()
    assert connected
    assert await communicator.receive_json_from() == {"key": registered}
    await communicator.disconnect()
    assert leaked(secret_scan) == [("websocket /ws/leaky/", registered)]


async def test_channel_layer_messages_received_in_the_test_are_scanned(secret_scan):
    registered = unremembered_value()
    secret_values_register({"LAYER_LEAK": registered})
    layer = get_channel_layer()
    channel = await layer.new_channel()
    await layer.send(channel, {"type": "conversation.message", "message": {"text": registered}})
    await layer.receive(channel)
    assert leaked(secret_scan) == [("channel layer message (conversation.message)", registered)]


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="the scan fails a leaking test")
@pytest.mark.django_db
def test_a_test_that_receives_a_secret_value_fails(leaky):
    """Leaks on purpose and asserts nothing: only the scan can fail it (strict xfail, so
    the suite fails if the scan ever lets it pass)."""
    secret_set(name="FAILING_LEAK", value=unremembered_value())
    Client().get("/leak/json/FAILING_LEAK/")
