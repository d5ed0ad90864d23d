"""The sign-in, registration and sign-out pages (Django session auth, CSRF)."""

from __future__ import annotations

import shutil

import pytest
from django.test import Client, override_settings

from accounts.models import User
from tests.conftest import PASSWORD

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("reset_throttles", "registration_open"),
]

REGISTER = "/accounts/register/"
LOGIN = "/accounts/login/"


def register(client: Client, **fields):
    body = {"username": "bob", "email": "", "password": PASSWORD, "password_again": PASSWORD}
    return client.post(REGISTER, {**body, **fields})


def test_the_chat_needs_a_session_and_sends_to_the_sign_in_page():
    response = Client().get("/")
    assert response.status_code == 302
    assert response["Location"] == f"{LOGIN}?next=/"


def test_sign_in_then_the_chat_then_sign_out(user):
    client = Client(enforce_csrf_checks=True)
    page = client.get(LOGIN)
    assert page.status_code == 200 and b'name="csrfmiddlewaretoken"' in page.content
    token = page.cookies["csrftoken"].value
    wrong = client.post(
        LOGIN, {"username": "alice", "password": "nope", "csrfmiddlewaretoken": token}
    )
    assert wrong.status_code == 200 and b"Please enter a correct username" in wrong.content
    signed_in = client.post(
        LOGIN, {"username": "alice", "password": PASSWORD, "csrfmiddlewaretoken": token}
    )
    assert signed_in.status_code == 302 and signed_in["Location"] == "/"
    chat = client.get("/")
    assert chat.status_code == 200 and b'id="paw-config"' in chat.content
    token = client.cookies["csrftoken"].value
    out = client.post("/accounts/logout/", {"csrfmiddlewaretoken": token})
    assert out.status_code == 302 and out["Location"] == LOGIN
    assert client.get("/").status_code == 302


def test_sign_in_without_the_csrf_token_is_refused(user):
    client = Client(enforce_csrf_checks=True)
    response = client.post(LOGIN, {"username": "alice", "password": PASSWORD})
    assert response.status_code == 403
    assert "_auth_user_id" not in client.session


def test_an_outside_next_address_is_not_followed(user):
    response = Client().post(
        f"{LOGIN}?next=https://evil.example/", {"username": "alice", "password": PASSWORD}
    )
    assert response.status_code == 302 and response["Location"] == "/"


@override_settings(PAW_THROTTLE_AUTH="3/min")
def test_sign_in_attempts_from_one_address_are_throttled(user, make_user):
    client = Client()
    for n in range(3):  # other usernames each time: the lockout per name would not see it
        response = client.post(LOGIN, {"username": f"user{n}", "password": "spray"})
        assert response.status_code == 200
    response = client.post(LOGIN, {"username": "alice", "password": PASSWORD})
    assert response.status_code == 429
    assert int(response["Retry-After"]) > 0
    assert b"Too many sign-in attempts" in response.content
    assert "_auth_user_id" not in client.session


def test_register_creates_the_account_and_signs_in():
    client = Client()
    response = register(client, username="bob", email="bob@example.org")
    assert response.status_code == 302 and response["Location"] == "/"
    bob = User.objects.get(username="bob")
    assert bob.email == "bob@example.org" and bob.check_password(PASSWORD)
    assert int(client.session["_auth_user_id"]) == bob.pk


def test_register_shows_every_password_problem_at_once_and_creates_nothing():
    response = register(Client(), password="12345", password_again="54321")
    assert response.status_code == 400
    text = response.content.decode()
    assert "too short" in text and "entirely numeric" in text
    assert "The two passwords differ." in text
    assert not User.objects.exists()


def test_register_help_texts_are_what_the_fields_point_at():
    text = Client().get(REGISTER).content.decode()
    assert 'aria-describedby="id_username_helptext"' in text
    assert 'id="id_username_helptext"' in text


def test_register_a_taken_name_in_other_case_is_refused(user):
    response = register(Client(), username="ALICE")
    assert response.status_code == 400
    assert b"That username is taken." in response.content
    assert User.objects.count() == 1


@override_settings(PAW_ALLOW_REGISTRATION=False)
def test_register_closed_is_403_and_says_so():
    client = Client()
    assert client.get(REGISTER).status_code == 403
    response = register(client)
    assert response.status_code == 403 and b"Registration is closed" in response.content
    assert not User.objects.exists()
    assert b"Create an account" not in client.get(LOGIN).content


@pytest.mark.django_db
def test_staff_see_on_the_chat_page_that_embedded_sandboxes_run_without_isolation(
    make_user, settings, monkeypatch, tmp_path
):
    settings.EMBEDDED = True  # the embedded mode: the one that falls back without bwrap
    settings.PAW_SANDBOX_ISOLATION = ""
    operator = make_user("operator", is_staff=True)
    person = make_user("person")

    def page(user) -> str:
        client = Client()
        client.force_login(user)
        return client.get("/").content.decode()

    if shutil.which("bwrap"):
        assert "isolation-warning" not in page(operator)  # bubblewrap is installed here
    monkeypatch.setenv("PATH", str(tmp_path))  # … and now it is not
    assert "Sandboxes run without isolation" in page(operator)
    assert "isolation-warning" not in page(person)
    settings.PAW_SANDBOX_ISOLATION = "none"  # chosen on purpose: no notice
    assert "isolation-warning" not in page(operator)
