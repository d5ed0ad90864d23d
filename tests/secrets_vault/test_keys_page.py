"""The API keys page: a person's own secrets from the web chat, values write-only (every
response is scanned for the values by the suite-wide secret scan)."""

from __future__ import annotations

import pytest
from django.test import Client

from secrets_vault.models import Secret
from secrets_vault.selectors import providers_for
from tests.secrets_vault.conftest import secret_value

pytestmark = pytest.mark.django_db

KEYS = "/settings/keys/"


@pytest.fixture
def browser(alice) -> Client:
    client = Client()
    client.force_login(alice)
    return client


def test_the_page_needs_a_session():
    response = Client().get(KEYS)
    assert response.status_code == 302 and response["Location"].startswith("/accounts/login/")


def test_saving_a_key_makes_its_provider_active_and_never_shows_the_value(browser, alice):
    assert not next(s for s in providers_for(user=alice) if s.name == "openai").active
    value = secret_value("sk")
    response = browser.post(
        KEYS, {"action": "set", "name": "OPENAI_API_KEY", "value": value, "description": "mine"}
    )
    assert response.status_code == 302 and response["Location"] == KEYS
    page = browser.get(KEYS)
    text = page.content.decode()
    assert "OPENAI_API_KEY saved." in text and "<code>OPENAI_API_KEY</code>" in text
    assert 'type="password"' in text
    secret = Secret.objects.get(owner=alice, name="OPENAI_API_KEY")
    assert secret.scope == Secret.Scope.USER and secret.value == value
    assert next(s for s in providers_for(user=alice) if s.name == "openai").active
    assert page["Content-Security-Policy"].startswith("default-src 'self'")


def test_saving_again_replaces_and_remove_deletes(browser, alice):
    browser.post(KEYS, {"action": "set", "name": "MY_TOKEN", "value": secret_value()})
    newer = secret_value()
    browser.post(KEYS, {"action": "set", "name": "MY_TOKEN", "value": newer})
    assert "MY_TOKEN replaced." in browser.get(KEYS).content.decode()
    assert Secret.objects.get(owner=alice, name="MY_TOKEN").value == newer
    response = browser.post(KEYS, {"action": "delete", "name": "MY_TOKEN"})
    assert response.status_code == 302
    assert not Secret.objects.filter(owner=alice).exists()
    assert "MY_TOKEN removed." in browser.get(KEYS).content.decode()


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("lower_case", "an upper-case letter, then upper-case letters"),
        ("", "cannot be blank"),
        ("PAW_SECRET_KEY", "PAW_SECRET_KEY is reserved"),
    ],
)
def test_a_bad_name_is_refused_on_the_form_and_nothing_is_stored(browser, name, message):
    response = browser.post(KEYS, {"action": "set", "name": name, "value": secret_value()})
    assert response.status_code == 400
    assert 'role="alert"' in response.content.decode()
    assert message in response.content.decode()
    assert not Secret.objects.exists()


def test_another_persons_keys_are_neither_listed_nor_removed(browser, make_user):
    from secrets_vault.services import secret_set

    other = make_user("mallory")
    secret_set(name="THEIR_KEY", value=secret_value(), user=other)
    assert "THEIR_KEY" not in browser.get(KEYS).content.decode()
    browser.post(KEYS, {"action": "delete", "name": "THEIR_KEY"})
    assert Secret.objects.filter(owner=other, name="THEIR_KEY").exists()


def test_a_post_without_the_csrf_token_changes_nothing(alice):
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    response = client.post(KEYS, {"action": "set", "name": "X_KEY", "value": secret_value()})
    assert response.status_code == 403
    assert not Secret.objects.exists()
