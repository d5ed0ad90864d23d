"""Auth API: register, token pair, refresh with rotation, revocation, me, session auth."""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from accounts.models import User
from tests.conftest import PASSWORD, api_client_for

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("reset_throttles", "registration_open"),
]


def login(username: str = "alice", password: str = PASSWORD) -> dict:
    response = APIClient().post(
        "/api/auth/token", {"username": username, "password": password}, format="json"
    )
    assert response.status_code == 200, response.content
    return response.json()


def bearer(access: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {access}")
    return client


def refresh(token: str):
    return APIClient().post("/api/auth/token/refresh", {"refresh": token}, format="json")


# --- register -----------------------------------------------------------------------------


def test_register_creates_an_active_user_and_answers_201():
    response = APIClient().post(
        "/api/auth/register",
        {"username": "bob", "password": PASSWORD, "email": "bob@example.org"},
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["username"] == "bob" and body["email"] == "bob@example.org"
    assert "password" not in body
    user = User.objects.get(username="bob")
    assert user.check_password(PASSWORD) and user.is_active and not user.is_staff


@pytest.mark.parametrize("password", ["short", "password123", "12345678901", "bobbobbob1"])
def test_register_applies_django_password_validators(password):
    response = APIClient().post(
        "/api/auth/register", {"username": "bobbobbob", "password": password}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "password_invalid"
    assert "password" in response.json()["fields"]
    assert not User.objects.filter(username="bobbobbob").exists()


def test_register_taken_username_is_409_case_insensitively(user):
    response = APIClient().post(
        "/api/auth/register", {"username": "ALICE", "password": PASSWORD}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["code"] == "username_taken"


def test_register_a_full_width_twin_of_a_taken_name_is_409(user):
    """Names are NFKC-normalized (as Django's forms do): "ａｌｉｃｅ" is "alice"."""
    response = APIClient().post(
        "/api/auth/register", {"username": "ａｌｉｃｅ", "password": PASSWORD}, format="json"
    )
    assert response.status_code == 409
    assert response.json()["code"] == "username_taken"
    assert User.objects.count() == 1


@pytest.mark.django_db(transaction=True)
def test_concurrent_registrations_differing_in_case_make_one_account():
    """The check before the insert can race; the database's case-insensitive constraint
    cannot: exactly one of four simultaneous registrations wins, the others get 409."""
    from accounts.services import user_register
    from paw_project.errors import Conflict

    names = ["Racer", "racer", "RACER", "rAcer"]
    barrier = threading.Barrier(len(names))
    outcomes: list[str] = []

    def register(name: str) -> None:
        barrier.wait()
        try:
            user_register(username=name, password=PASSWORD)
            outcomes.append("created")
        except Conflict as error:
            outcomes.append(error.code)
        finally:
            connection.close()

    threads = [threading.Thread(target=register, args=(name,)) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert sorted(outcomes) == ["created"] + ["username_taken"] * 3
    assert User.objects.filter(username__iexact="racer").count() == 1


@pytest.mark.parametrize(
    "body",
    [
        {"username": "bob"},
        {"username": "bob", "password": PASSWORD, "is_staff": True},
        {"username": "b o b", "password": PASSWORD},
        {"username": "bob", "password": PASSWORD, "email": "not-an-email"},
        {"username": ["bob"], "password": PASSWORD},
        {"username": "x" * 151, "password": PASSWORD},
    ],
)
def test_register_bad_input_is_400_and_creates_nothing(body):
    response = APIClient().post("/api/auth/register", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["detail"]
    assert User.objects.count() == 0


def test_register_unknown_field_names_it():
    response = APIClient().post(
        "/api/auth/register",
        {"username": "bob", "password": PASSWORD, "is_superuser": True},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["code"] == "unknown_field"
    assert "is_superuser" in response.json()["fields"]


@override_settings(PAW_ALLOW_REGISTRATION=False)
def test_register_can_be_closed():
    response = APIClient().post(
        "/api/auth/register", {"username": "bob", "password": PASSWORD}, format="json"
    )
    assert response.status_code == 403
    assert response.json()["code"] == "registration_closed"


# --- token, me ------------------------------------------------------------------------------


def test_token_pair_authenticates_me(user):
    pair = login()
    assert set(pair) == {"access", "refresh"}
    response = bearer(pair["access"]).get("/api/auth/me")
    assert response.status_code == 200
    assert response.json()["username"] == "alice"
    user.refresh_from_db()
    assert user.last_login is not None


@pytest.mark.parametrize(
    ("username", "password"), [("alice", "wrong password 42"), ("nobody", PASSWORD)]
)
def test_wrong_credentials_are_401_with_one_answer(user, username, password):
    response = APIClient().post(
        "/api/auth/token", {"username": username, "password": password}, format="json"
    )
    assert response.status_code == 401
    assert response.json()["code"] == "invalid_credentials"
    assert "WWW-Authenticate" in response


def test_inactive_user_gets_no_token(user):
    user.is_active = False
    user.save()
    response = APIClient().post(
        "/api/auth/token", {"username": "alice", "password": PASSWORD}, format="json"
    )
    assert response.status_code == 401


def test_me_without_credentials_is_401():
    response = APIClient().get("/api/auth/me")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"


@pytest.mark.parametrize("header", ["Bearer garbage", "Bearer a.b.c", "Bearer"])
def test_malformed_bearer_token_is_401(header):
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=header)
    response = client.get("/api/auth/me")
    assert response.status_code == 401
    assert response.json()["detail"]


def test_refresh_token_is_not_accepted_as_access_token(user):
    pair = login()
    assert bearer(pair["refresh"]).get("/api/auth/me").status_code == 401


def test_access_token_of_deleted_user_is_401(user):
    pair = login()
    user.delete()
    response = bearer(pair["access"]).get("/api/auth/me")
    assert response.status_code == 401
    assert response.json()["code"] == "user_not_found"


def test_access_token_of_a_deactivated_user_is_401(user):
    pair = login()
    User.objects.filter(pk=user.pk).update(is_active=False)
    response = bearer(pair["access"]).get("/api/auth/me")
    assert response.status_code == 401
    assert response.json()["code"] == "user_inactive"


def test_a_signed_access_token_without_a_user_is_401(user):
    from rest_framework_simplejwt.tokens import AccessToken

    response = bearer(str(AccessToken())).get("/api/auth/me")
    assert response.status_code == 401
    assert response.json()["code"] == "token_not_valid"


# --- refresh --------------------------------------------------------------------------------


def test_refresh_rotates_and_blacklists_the_old_refresh_token(user):
    pair = login()
    response = refresh(pair["refresh"])
    assert response.status_code == 200
    rotated = response.json()
    assert rotated["refresh"] != pair["refresh"]
    assert bearer(rotated["access"]).get("/api/auth/me").status_code == 200
    again = refresh(pair["refresh"])
    assert again.status_code == 401
    assert again.json()["code"] == "token_not_valid"
    assert refresh(rotated["refresh"]).status_code == 200


@pytest.mark.parametrize("token", ["", "garbage", "a.b.c"])
def test_refresh_with_a_bad_token_is_rejected(token):
    response = refresh(token)
    assert response.status_code in (400, 401)
    assert response.json()["code"] in ("blank", "token_not_valid")


def test_refresh_with_an_access_token_is_401(user):
    pair = login()
    assert refresh(pair["access"]).status_code == 401


def test_refresh_for_a_deactivated_user_is_401(user):
    pair = login()
    User.objects.filter(pk=user.pk).update(is_active=False)
    assert refresh(pair["refresh"]).status_code == 401


# --- revocation: logout and password change ---------------------------------------------------


def test_logout_revokes_every_access_and_refresh_token_of_the_user(user):
    first, second = login(), login()
    response = bearer(first["access"]).post("/api/auth/logout")
    assert response.status_code == 204
    for pair in (first, second):
        denied = bearer(pair["access"]).get("/api/auth/me")
        assert denied.status_code == 401
        assert denied.json()["code"] == "token_revoked"
        assert refresh(pair["refresh"]).json()["code"] == "token_revoked"
    # Logging in again works, with the new version.
    assert bearer(login()["access"]).get("/api/auth/me").status_code == 200


def test_logout_of_one_user_leaves_other_users_tokens(user, other_user):
    mine, theirs = login("alice"), login("mallory")
    bearer(mine["access"]).post("/api/auth/logout")
    assert bearer(theirs["access"]).get("/api/auth/me").status_code == 200
    assert refresh(theirs["refresh"]).status_code == 200


def test_password_change_revokes_earlier_tokens_and_returns_a_working_pair(user):
    before = login()
    new_password = "another horse battery staple 43"
    response = bearer(before["access"]).post(
        "/api/auth/password",
        {"old_password": PASSWORD, "new_password": new_password},
        format="json",
    )
    assert response.status_code == 200, response.content
    after = response.json()
    assert bearer(before["access"]).get("/api/auth/me").status_code == 401
    assert refresh(before["refresh"]).status_code == 401
    assert bearer(after["access"]).get("/api/auth/me").status_code == 200
    assert refresh(after["refresh"]).status_code == 200
    login("alice", new_password)


def test_password_change_with_wrong_old_password_is_400_and_changes_nothing(user):
    pair = login()
    response = bearer(pair["access"]).post(
        "/api/auth/password",
        {"old_password": "not it", "new_password": "another horse battery staple 43"},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["code"] == "wrong_password"
    assert bearer(pair["access"]).get("/api/auth/me").status_code == 200
    user.refresh_from_db()
    assert user.check_password(PASSWORD)


def test_password_change_validates_the_new_password(user):
    response = api_client_for(user).post(
        "/api/auth/password", {"old_password": PASSWORD, "new_password": "123"}, format="json"
    )
    assert response.status_code == 400
    assert response.json()["code"] == "password_invalid"


# --- session auth (the chat page) -------------------------------------------------------------


def test_session_auth_works_and_needs_csrf_for_writes(user):
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(user)
    assert client.get("/api/auth/me").status_code == 200
    denied = client.post("/api/conversations", {"title": "x"}, format="json")
    assert denied.status_code == 403
    assert "CSRF" in denied.json()["detail"]
    client.get("/api/auth/me")  # no CSRF cookie from the API; take it from Django
    from django.middleware.csrf import _get_new_csrf_string

    token = _get_new_csrf_string()
    client.cookies["csrftoken"] = token
    allowed = client.post(
        "/api/conversations", {"title": "x"}, format="json", HTTP_X_CSRFTOKEN=token
    )
    assert allowed.status_code == 201


def test_session_logout_ends_the_session(user):
    client = APIClient()
    client.force_login(user)
    assert client.post("/api/auth/logout").status_code == 204
    assert client.get("/api/auth/me").status_code == 401


# --- throttle --------------------------------------------------------------------------------


@override_settings(PAW_THROTTLE_AUTH="3/min")
def test_auth_endpoints_are_throttled_per_ip_with_retry_after(user):
    client = APIClient()
    for _ in range(3):
        response = client.post(
            "/api/auth/token", {"username": "alice", "password": "wrong"}, format="json"
        )
        assert response.status_code == 401
    for path, body in [
        ("/api/auth/token", {"username": "alice", "password": PASSWORD}),
        ("/api/auth/token/refresh", {"refresh": "x"}),
        ("/api/auth/register", {"username": "carol", "password": PASSWORD}),
    ]:
        response = client.post(path, body, format="json")
        assert response.status_code == 429, path
        assert response.json()["code"] == "throttled"
        assert 0 < int(response["Retry-After"]) <= 60


@override_settings(PAW_THROTTLE_AUTH="2/min")
def test_password_guesses_with_a_stolen_token_are_throttled_per_user(user):
    client = api_client_for(user)
    body = {"old_password": "guess", "new_password": "another long passphrase 7"}
    for address in ("198.51.100.1", "198.51.100.2"):
        response = client.post("/api/auth/password", body, format="json", REMOTE_ADDR=address)
        assert response.status_code == 400
    # A third guess, even from a third address, waits: the limit is the user's.
    response = client.post("/api/auth/password", body, format="json", REMOTE_ADDR="198.51.100.3")
    assert response.status_code == 429
    assert response.json()["code"] == "throttled"
    assert int(response["Retry-After"]) > 0
    user.refresh_from_db()
    assert user.check_password(PASSWORD)


@override_settings(PAW_THROTTLE_AUTH="1/min")
def test_auth_throttle_ignores_a_forged_x_forwarded_for(user):
    client = APIClient()
    body = {"username": "alice", "password": "wrong"}
    assert client.post("/api/auth/token", body, format="json").status_code == 401
    response = client.post(
        "/api/auth/token", body, format="json", HTTP_X_FORWARDED_FOR="203.0.113.9"
    )
    assert response.status_code == 429
