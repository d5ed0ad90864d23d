"""Fixtures of the secrets vault tests: users, clients, and generated secret values.

Every response any test receives is scanned for known secret values by the suite-wide
scan (``tests/secrets_vault/leak_scan.py``, wired in ``tests/conftest.py``); values made
with :func:`secret_value` are known to it from the moment they exist, even before they
are stored.
"""

from __future__ import annotations

import secrets as pysecrets

import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tests.secrets_vault import leak_scan


def secret_value(label: str = "sv") -> str:
    """A fresh, unmistakable secret value, known to the secret scan at once."""
    value = f"{label}-{pysecrets.token_hex(12)}"
    leak_scan.remember(value)
    return value


@pytest.fixture
def make_client():
    """``make_client(user=None)``: a test client signed in as ``user`` (session)."""

    def make(user=None) -> APIClient:
        client = APIClient()
        if user is not None:
            client.force_login(user)
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
def alice_api(make_client, alice) -> APIClient:
    return make_client(alice)


@pytest.fixture
def bob_api(make_client, bob) -> APIClient:
    return make_client(bob)


@pytest.fixture
def operator_client(make_client, operator) -> APIClient:
    return make_client(operator)
