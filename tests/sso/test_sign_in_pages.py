"""The sign-in pages with single sign-on configured: the start of a sign-in (against the
real test provider's discovery document), the callback's refusals, the admin's sign-in,
and ``PAW_PASSWORD_LOGIN=0``."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.messages import get_messages
from django.test import Client

from paw_project.errors import InvalidRequest
from secrets_vault.masking import secret_values_known
from sso.provider import ProviderUnavailable, client_secret, provider_configuration
from tests.conftest import PASSWORD
from tests.sso.conftest import CLIENT_ID, CLIENT_SECRET, PROVIDER_NAME

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("reset_throttles")]

LOGIN = "/accounts/login/"
START = "/accounts/sso/start/"
CALLBACK = "/accounts/sso/callback/"


@pytest.fixture
def sso(settings, oidc_provider, client_secret_in_vault):
    """Single sign-on configured in this process, against the test provider."""
    settings.PAW_OIDC_ISSUER = oidc_provider.issuer
    settings.PAW_OIDC_CLIENT_ID = CLIENT_ID
    settings.PAW_OIDC_CLIENT_SECRET = "{secret:OIDC_CLIENT_SECRET}"
    settings.PAW_OIDC_NAME = PROVIDER_NAME
    return oidc_provider


def messages_of(response) -> list[str]:
    return [str(m) for m in get_messages(response.wsgi_request)]


def test_the_sign_in_page_offers_the_provider_next_to_the_password(sso):
    page = Client().get(f"{LOGIN}?next=/c/x/")
    body = page.content.decode()
    assert f"Sign in with {PROVIDER_NAME}" in body
    assert f'href="{START}?next=%2Fc%2Fx%2F"' in body
    assert 'name="password"' in body


def test_without_single_sign_on_there_is_no_button_and_no_start(settings):
    settings.PAW_OIDC_ISSUER = ""
    assert b"Sign in with" not in Client().get(LOGIN).content
    assert Client().get(START).status_code == 404
    assert Client().get(CALLBACK).status_code == 404


def test_the_start_goes_to_the_providers_authorization_endpoint_with_pkce_and_a_nonce(sso):
    client = Client()
    response = client.get(f"{START}?next=/c/x/")
    assert response.status_code == 302
    target = urlsplit(response["Location"])
    assert (
        f"{target.scheme}://{target.netloc}{target.path}"
        == (provider_configuration()["authorization_endpoint"])
    )
    query = {key: values[0] for key, values in parse_qs(target.query).items()}
    assert query["client_id"] == CLIENT_ID and query["response_type"] == "code"
    assert query["redirect_uri"] == f"http://testserver{CALLBACK}"
    assert query["code_challenge_method"] == "S256" and len(query["code_challenge"]) == 43
    assert query["nonce"] and query["state"] in client.session["oidc_states"]
    assert client.session["oidc_login_next"] == "/c/x/"
    # An outside address is not remembered as where to go after signing in.
    client.get(f"{START}?next=https://evil.example/")
    assert client.session["oidc_login_next"] is None


def test_an_unreachable_provider_sends_back_to_the_sign_in_page_saying_so(sso, settings):
    from tests.processes import free_port

    settings.PAW_OIDC_ISSUER = f"http://127.0.0.1:{free_port()}"
    response = Client().get(f"{START}?next=/c/x/")
    assert response.status_code == 302 and response["Location"] == f"{LOGIN}?next=%2Fc%2Fx%2F"
    assert messages_of(response) == [
        "The sign-in service cannot be reached right now; try again in a moment."
    ]


def test_a_discovery_document_of_another_issuer_is_refused(sso, settings):
    settings.PAW_OIDC_ISSUER = f"{sso.issuer}/"  # one slash more: another issuer
    with pytest.raises(ProviderUnavailable, match=f"names the issuer '{sso.issuer}'"):
        provider_configuration()


def test_a_callback_the_session_did_not_start_signs_nobody_in(sso):
    client = Client()
    client.get(START)  # a sign-in under way, with its own state
    response = client.get(f"{CALLBACK}?code=stolen&state=not-ours")
    assert response.status_code == 302 and response["Location"] == LOGIN
    assert messages_of(response) == ["The sign-in could not be completed; please start it again."]
    assert "_auth_user_id" not in client.session


def test_a_cancelled_sign_in_says_so(sso):
    client = Client()
    client.get(START)
    state = next(iter(client.session["oidc_states"]))
    response = client.get(f"{CALLBACK}?error=access_denied&state={state}")
    assert response["Location"] == LOGIN
    assert messages_of(response) == ["The sign-in was cancelled or refused at the sign-in service."]
    assert state not in client.session["oidc_states"]  # not usable again


def test_the_sign_in_page_shows_why_once(sso, make_user):
    client = Client()
    client.force_login(make_user("alice", is_staff=True, is_superuser=True))
    # Another page's message (the admin's "changed successfully") is not a sign-in problem.
    saved = client.post(
        f"/admin/accounts/user/{make_user('bob').pk}/change/",
        {"username": "bob", "is_active": "on", "date_joined_0": "2026-01-01",
         "date_joined_1": "00:00:00", "budget-TOTAL_FORMS": "0", "budget-INITIAL_FORMS": "0"},
    )  # fmt: skip
    assert saved.status_code == 302, saved.content.decode()[:3000]
    client.logout()
    client.get(START)
    state = next(iter(client.session["oidc_states"]))
    client.get(f"{CALLBACK}?error=access_denied&state={state}")
    page = client.get(LOGIN).content.decode()
    assert "The sign-in was cancelled or refused at the sign-in service." in page
    assert "changed successfully" not in page
    assert 'role="alert"' not in client.get(LOGIN).content.decode()


def test_the_client_secret_comes_from_the_vault_or_as_it_is(sso, settings):
    assert client_secret() == CLIENT_SECRET
    settings.PAW_OIDC_CLIENT_SECRET = "{secret:NEVER_SET}"
    with pytest.raises(InvalidRequest) as missing:
        client_secret()
    assert missing.value.code == "secret_missing"
    settings.PAW_OIDC_CLIENT_SECRET = "a-Literal-client-secret-42"
    assert client_secret() == "a-Literal-client-secret-42"
    assert "a-Literal-client-secret-42" in secret_values_known().values()  # masked in logs


def test_with_single_sign_on_the_admin_signs_in_on_paws_page(sso, make_user):
    response = Client().get("/admin/login/?next=/admin/conversations/")
    assert response.status_code == 302
    assert response["Location"] == f"{LOGIN}?next=%2Fadmin%2Fconversations%2F"
    # Someone signed in but not staff sees the admin's own answer, not a loop.
    client = Client()
    client.force_login(make_user("alice"))
    page = client.get("/admin/login/?next=/admin/")
    assert page.status_code == 200 and b"not authorized to access this page" in page.content


def test_without_single_sign_on_the_admin_keeps_its_own_sign_in(settings):
    settings.PAW_OIDC_ISSUER = ""
    page = Client().get("/admin/login/")
    assert page.status_code == 200 and b'id="login-form"' in page.content


@pytest.fixture
def password_login_off(sso, settings):
    settings.PAW_PASSWORD_LOGIN = False
    settings.PAW_ALLOW_REGISTRATION = False  # what the settings do with it


def test_without_password_sign_in_the_page_offers_only_the_provider(password_login_off, user):
    page = Client().get(LOGIN).content.decode()
    assert f"Sign in with {PROVIDER_NAME}" in page
    assert 'name="password"' not in page and "Create an account" not in page
    client = Client()
    refused = client.post(LOGIN, {"username": "alice", "password": PASSWORD})
    assert refused.status_code == 403
    assert b"Sign-in with a password is turned off" in refused.content
    assert "_auth_user_id" not in client.session


def test_without_password_sign_in_the_api_gives_no_token(password_login_off, user):
    response = Client().post(
        "/api/auth/token",
        {"username": "alice", "password": PASSWORD},
        content_type="application/json",
    )
    assert response.status_code == 403
    assert response.json()["code"] == "password_login_disabled"


def test_without_password_sign_in_the_admins_form_is_refused(password_login_off, make_user):
    make_user("root", is_staff=True, is_superuser=True)
    client = Client()
    response = client.post("/admin/login/", {"username": "root", "password": PASSWORD})
    assert response.status_code == 302 and response["Location"].startswith(LOGIN)
    assert "_auth_user_id" not in client.session
    # A signed-in person posting the admin's form is refused too.
    client.force_login(make_user("alice"))
    assert (
        client.post("/admin/login/", {"username": "root", "password": PASSWORD}).status_code == 403
    )
