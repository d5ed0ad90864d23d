"""Login throttling (django-axes): after PAW_LOGIN_FAILURE_LIMIT failures for one username
from one address, that pair is refused for PAW_LOGIN_COOLOFF_MINUTES, in the admin and in
the API's token endpoint alike."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import authenticate, get_user_model
from django.urls import include, path
from rest_framework_simplejwt.views import TokenObtainPairView

urlpatterns = [
    path("api/token/", TokenObtainPairView.as_view()),
    path("", include("paw_project.urls")),
]

pytestmark = [pytest.mark.urls(__name__), pytest.mark.django_db]

PASSWORD = "a-long-operator-password"


@pytest.fixture
def admin_user():
    return get_user_model().objects.create_superuser(username="boss", password=PASSWORD)


def admin_login(client, password: str, address: str = "10.0.0.1", username: str = "boss"):
    return client.post(
        "/admin/login/",
        {"username": username, "password": password, "next": "/admin/"},
        REMOTE_ADDR=address,
    )


def test_the_defaults_are_ten_failures_and_fifteen_minutes():
    assert settings.AXES_FAILURE_LIMIT == 10
    assert settings.AXES_COOLOFF_TIME.total_seconds() == 15 * 60


def test_the_admin_login_locks_a_username_and_address_out_after_the_limit(client, admin_user):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert admin_login(client, "wrong").status_code == 200  # the form again, with an error
    assert admin_login(client, "wrong").status_code == 429
    locked = admin_login(client, PASSWORD)  # even the right password, now
    assert locked.status_code == 429
    assert int(locked["Retry-After"]) == 15 * 60
    assert "_auth_user_id" not in client.session
    # Another address, or another username from the same address, is not locked out.
    assert admin_login(client, "wrong", username="someone").status_code == 200
    assert admin_login(client, PASSWORD, address="10.0.0.2").status_code == 302


def test_a_success_before_the_limit_starts_the_count_again(client, admin_user):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        admin_login(client, "wrong")
    assert admin_login(client, PASSWORD).status_code == 302
    client.logout()
    assert admin_login(client, "wrong").status_code == 200


def test_the_token_endpoint_answers_a_locked_out_pair_with_json_429(client, admin_user):
    def token(password: str):
        return client.post(
            "/api/token/",
            {"username": "boss", "password": password},
            content_type="application/json",
            REMOTE_ADDR="10.0.0.3",
        )

    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert token("wrong").status_code == 401
    response = token("wrong")
    assert response.status_code == 429
    assert response.json()["code"] == "locked_out"
    assert response.json()["detail"]
    assert token(PASSWORD).status_code == 429
    assert "access" not in token(PASSWORD).json()


def test_authenticate_without_a_request_still_works(admin_user):
    """Management commands and scripts have no client address to lock out."""
    assert authenticate(username="boss", password=PASSWORD) == admin_user
    assert authenticate(username="boss", password="wrong") is None
