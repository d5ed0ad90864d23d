"""Personal API tokens: made, listed and revoked over the API and on the API keys page;
accepted on every endpoint (the staff API included) and on the websocket; revoked by a
logout or a password change; throttled; ``last_used`` written at most once a minute."""

from __future__ import annotations

from datetime import timedelta

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from accounts.models import PersonalToken
from accounts.services import personal_token_create, personal_token_delete
from paw_project.asgi import application
from tests.conftest import PASSWORD, api_client_for, use_up_throttle
from tests.factories import ConversationFactory

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("reset_throttles")]

TOKENS = "/api/auth/tokens"


def bearer(value: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {value}")
    return client


def make(api: APIClient, **body) -> dict:
    response = api.post(TOKENS, {"name": "notebook", **body}, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def test_a_token_is_shown_once_stored_hashed_and_works_on_the_api(api, user):
    created = make(api, expires_in_days=30)
    value = created["token"]
    assert value.startswith("paw_") and len(value) >= 40
    assert created["name"] == "notebook" and created["prefix"] == value[:12]
    assert created["expires"] is not None and created["last_used"] is None
    stored = PersonalToken.objects.get(pk=created["id"])
    assert value not in (stored.token_hash, stored.prefix) and len(stored.token_hash) == 64
    me = bearer(value).get("/api/auth/me")
    assert me.status_code == 200 and me.json()["username"] == "alice"
    assert bearer(value).post("/api/conversations", {}, format="json").status_code == 201
    listed = api.get(TOKENS).json()
    assert listed["count"] == 1
    (row,) = listed["results"]
    assert "token" not in row and row["id"] == created["id"] and row["last_used"] is not None


def test_an_unknown_or_malformed_paw_token_is_401_not_a_jwt_error(user):
    for value in ("paw_" + "x" * 43, "paw_", "paw_\u00e9"):
        response = bearer(value).get("/api/auth/me")
        assert response.status_code == 401
        assert response.json()["code"] in ("token_not_valid", "authentication_failed")
    # A JWT still works beside it.
    assert api_client_for(user).get("/api/auth/me").status_code == 200


def test_an_expired_token_is_refused(api, user):
    value = make(api, expires_in_days=1)["token"]
    PersonalToken.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    assert bearer(value).get("/api/auth/me").status_code == 401


def test_deleting_a_token_revokes_it_and_another_persons_is_404(api, other_api):
    value = make(api)["token"]
    token_id = PersonalToken.objects.get().pk
    assert other_api.delete(f"{TOKENS}/{token_id}").status_code == 404
    assert bearer(value).get("/api/auth/me").status_code == 200
    assert api.delete(f"{TOKENS}/{token_id}").status_code == 204
    assert bearer(value).get("/api/auth/me").status_code == 401
    assert api.delete(f"{TOKENS}/{token_id}").json()["code"] == "not_found"


def test_logout_everywhere_and_a_password_change_revoke_personal_tokens(user):
    api = api_client_for(user)
    first = make(api)["token"]
    assert bearer(first).post("/api/auth/logout").status_code == 204
    assert bearer(first).get("/api/auth/me").status_code == 401
    assert not PersonalToken.objects.exists()  # revoked ones are gone, not listed
    user.refresh_from_db()
    api = api_client_for(user)
    second = make(api)["token"]
    changed = bearer(second).post(
        "/api/auth/password",
        {"old_password": PASSWORD, "new_password": "a new long passphrase 43"},
        format="json",
    )
    assert changed.status_code == 200
    assert bearer(second).get("/api/auth/me").status_code == 401
    assert bearer(changed.json()["access"]).get(TOKENS).json()["count"] == 0


@pytest.mark.parametrize(
    "body",
    [
        {"name": ""},
        {"name": "   "},
        {"name": "x" * 101},
        {"name": "n", "expires_in_days": 0},
        {"name": "n", "expires_in_days": 3651},
        {"name": "n", "expires_in_days": "soon"},
        {"name": "n", "scope": "all"},
    ],
)
def test_bad_input_is_400_and_makes_no_token(api, body):
    response = api.post(TOKENS, body, format="json")
    assert response.status_code == 400, response.content
    assert set(response.json()) >= {"detail", "code"}
    assert not PersonalToken.objects.exists()


def test_a_person_holds_at_most_fifty_tokens(user):
    for n in range(50):
        personal_token_create(user=user, name=f"t{n}")
    response = api_client_for(user).post(TOKENS, {"name": "one more"}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "too_many_tokens"
    assert PersonalToken.objects.count() == 50


def test_token_changes_are_throttled_per_user(api, settings):
    settings.PAW_THROTTLE_AUTH = "2/min"
    make(api)
    make(api)
    response = api.post(TOKENS, {"name": "third"}, format="json")
    assert response.status_code == 429 and response.json()["code"] == "throttled"
    assert int(response["Retry-After"]) > 0
    assert api.get(TOKENS).status_code == 200  # listing is not counted


def test_run_starts_with_a_token_count_against_the_users_throttle(api, user, settings):

    settings.PAW_THROTTLE_RUNS = "1/min"
    value = make(api)["token"]
    conversation = ConversationFactory(user=user)
    use_up_throttle("runs", f"user-{user.pk}", settings.PAW_THROTTLE_RUNS)
    response = bearer(value).post(
        f"/api/conversations/{conversation.id}/runs", {"prompt": "hi"}, format="json"
    )
    assert response.status_code == 429, response.content
    assert response.json()["code"] == "throttled"
    assert int(response["Retry-After"]) > 0, dict(response.items())


def test_last_used_is_written_at_most_once_a_minute(api):
    value = make(api)["token"]
    client = bearer(value)
    assert client.get("/api/auth/me").status_code == 200
    with CaptureQueriesContext(connection) as queries:
        for _ in range(3):
            assert client.get("/api/auth/me").status_code == 200
    assert not [q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    # One lookup of the token per request (and one of the teams /me shows).
    lookups = [q for q in queries.captured_queries if "accounts_personaltoken" in q["sql"]]
    assert len(lookups) == 3
    assert len(queries.captured_queries) == 6
    PersonalToken.objects.update(last_used_at=timezone.now() - timedelta(minutes=2))
    with CaptureQueriesContext(connection) as queries:
        client.get("/api/auth/me")
    assert len([q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]) == 1
    assert timezone.now() - PersonalToken.objects.get().last_used_at < timedelta(seconds=30)


def test_a_staff_members_token_reaches_the_admin_api(make_user):
    staff = make_user("operator", is_staff=True)
    _, staff_value = personal_token_create(user=staff, name="ops")
    _, plain_value = personal_token_create(user=make_user("bob"), name="mine")
    assert bearer(staff_value).get("/api/admin/secrets").status_code == 200
    assert bearer(plain_value).get("/api/admin/secrets").status_code == 403


def test_the_schema_documents_the_token_endpoints_and_scheme(api):
    schema = APIClient().get("/api/schema/?format=json").json()
    assert {"get", "post"} <= set(schema["paths"]["/api/auth/tokens"])
    assert "delete" in schema["paths"]["/api/auth/tokens/{token_id}"]
    assert schema["components"]["securitySchemes"]["personalToken"]["scheme"] == "bearer"


# --- the websocket ------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
async def test_a_token_opens_the_websocket_and_deleting_it_closes_that_socket_only(db):
    conversation = await database_sync_to_async(ConversationFactory)()
    owner = await database_sync_to_async(lambda: conversation.user)()
    (_kept, kept_value), (dropped, dropped_value) = [
        await database_sync_to_async(personal_token_create)(user=owner, name=name)
        for name in ("kept", "dropped")
    ]
    origin = [(b"origin", b"http://localhost")]
    path = f"/ws/conversations/{conversation.id}/"
    by_query = WebsocketCommunicator(application, f"{path}?token={dropped_value}", origin)
    assert (await by_query.connect())[0]
    by_protocol = WebsocketCommunicator(application, path, origin, subprotocols=["paw", kept_value])
    connected, subprotocol = await by_protocol.connect()
    assert connected and subprotocol == "paw"
    for tab in (by_query, by_protocol):
        await tab.send_json_to({"type": "ping"})
        assert await tab.receive_json_from() == {"type": "pong"}
    await database_sync_to_async(personal_token_delete)(user=owner, token_id=dropped.pk)
    assert await by_query.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
    await by_protocol.send_json_to({"type": "ping"})
    assert await by_protocol.receive_json_from() == {"type": "pong"}
    await by_protocol.disconnect()
    refused = WebsocketCommunicator(application, f"{path}?token={dropped_value}", origin)
    await refused.connect()
    assert await refused.receive_output(timeout=5) == {"type": "websocket.close", "code": 4401}
    for tab in (by_query, refused):
        await tab.disconnect()


# --- the API keys page --------------------------------------------------------------------


def test_the_keys_page_makes_lists_and_revokes_tokens(user):
    browser = Client()
    browser.force_login(user)
    page = browser.post(
        "/settings/keys/",
        {"action": "token_create", "token_name": "laptop", "expires_in_days": "7"},
    )
    assert page.status_code == 201
    token = PersonalToken.objects.get()
    text = page.content.decode()
    value = text.split('id="new-token-value" readonly value="')[1].split('"')[0]
    assert value.startswith(token.prefix) and "not shown again" in text
    assert bearer(value).get("/api/auth/me").status_code == 200
    listed = browser.get("/settings/keys/").content.decode()
    assert "laptop" in listed and token.prefix in listed and value not in listed
    bad = browser.post("/settings/keys/", {"action": "token_create", "token_name": " "})
    assert bad.status_code == 400 and PersonalToken.objects.count() == 1
    bad_days = browser.post(
        "/settings/keys/", {"action": "token_create", "token_name": "x", "expires_in_days": "²"}
    )
    assert bad_days.status_code == 400 and PersonalToken.objects.count() == 1
    gone = browser.post("/settings/keys/", {"action": "token_delete", "token_id": str(token.pk)})
    assert gone.status_code == 302
    assert not PersonalToken.objects.exists()
    assert bearer(value).get("/api/auth/me").status_code == 401
