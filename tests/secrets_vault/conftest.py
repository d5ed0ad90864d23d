"""Fixtures of the secrets vault tests: users, clients whose every response is scanned
for secret values, and generated secret values the scan looks for."""

from __future__ import annotations

import json
import secrets as pysecrets
from collections.abc import Iterator

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from secrets_vault.masking import secret_values_known

# Every secret value a test makes with `secret_value()`: no response may contain one.
SECRET_VALUES: set[str] = set()


def secret_value(label: str = "sv") -> str:
    """A fresh, unmistakable secret value, remembered for the response scan."""
    value = f"{label}-{pysecrets.token_hex(12)}"
    SECRET_VALUES.add(value)
    return value


def leaks(body: str) -> list[str]:
    """The known secret values found in ``body`` (and their JSON-escaped forms)."""
    values = SECRET_VALUES | set(secret_values_known().values())
    return sorted(
        value
        for value in values
        if len(value) >= 4 and (value in body or json.dumps(value)[1:-1] in body)
    )


class ScanningClient(APIClient):
    """A test client (API and admin pages) that keeps every response it got."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.responses: list = []

    def request(self, *args, **kwargs):
        response = super().request(*args, **kwargs)
        self.responses.append(response)
        return response


def _response_text(response) -> str:
    headers = "\n".join(f"{name}: {value}" for name, value in response.headers.items())
    body = b"" if getattr(response, "streaming", False) else response.content
    return headers + "\n" + body.decode("utf-8", errors="replace")


@pytest.fixture
def scanned() -> Iterator[list[ScanningClient]]:
    """The clients made in this test; after it, no response may contain a secret value."""
    clients: list[ScanningClient] = []
    yield clients
    for client in clients:
        for response in client.responses:
            found = leaks(_response_text(response))
            path = response.request.get("PATH_INFO")
            assert not found, f"secret value(s) in the response to {path}: {found}"


@pytest.fixture
def make_client(scanned):
    def make(user=None) -> ScanningClient:
        client = ScanningClient()
        if user is not None:
            client.force_login(user)
        scanned.append(client)
        return client

    return make


@pytest.fixture
def alice(db):
    return get_user_model().objects.create_user("alice")


@pytest.fixture
def bob(db):
    return get_user_model().objects.create_user("bob")


@pytest.fixture
def operator(db):
    return get_user_model().objects.create_superuser("operator", password=None)


@pytest.fixture
def alice_api(make_client, alice) -> ScanningClient:
    return make_client(alice)


@pytest.fixture
def bob_api(make_client, bob) -> ScanningClient:
    return make_client(bob)


@pytest.fixture
def operator_client(make_client, operator) -> ScanningClient:
    return make_client(operator)
