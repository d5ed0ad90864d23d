"""The users' secrets API and the operators' secrets API: values go in, never out."""

from __future__ import annotations

import pytest

from secrets_vault.models import Secret
from secrets_vault.services import secret_set
from tests.secrets_vault.conftest import secret_value


def test_put_creates_then_replaces_and_get_lists_names_never_values(alice_api, alice):
    first, second = secret_value("put1"), secret_value("put2")
    created = alice_api.put(
        "/api/secrets/MY_TOKEN", {"value": first, "description": "ci"}, format="json"
    )
    assert created.status_code == 201, created.json()
    assert created.json()["name"] == "MY_TOKEN"
    assert "value" not in created.json()
    replaced = alice_api.put("/api/secrets/MY_TOKEN", {"value": second}, format="json")
    assert replaced.status_code == 200
    assert replaced.json()["description"] == "ci", "description kept when not sent"
    listed = alice_api.get("/api/secrets").json()
    assert [s["name"] for s in listed["secrets"]] == ["MY_TOKEN"]
    assert set(listed["secrets"][0]) == {
        "name", "description", "created_at", "updated_at", "last_used_at"
    }  # fmt: skip
    assert Secret.objects.get(owner=alice, name="MY_TOKEN").value == second


def test_a_value_is_stored_exactly_as_sent(alice_api, alice):
    value = "  " + secret_value("spaces") + " \n"
    assert alice_api.put("/api/secrets/SPACED", {"value": value}, format="json").status_code == 201
    assert Secret.objects.get(owner=alice, name="SPACED").value == value


def test_delete_removes_the_secret_and_a_second_delete_is_404(alice_api):
    alice_api.put("/api/secrets/GONE_SOON", {"value": secret_value()}, format="json")
    assert alice_api.delete("/api/secrets/GONE_SOON").status_code == 204
    missing = alice_api.delete("/api/secrets/GONE_SOON")
    assert missing.status_code == 404
    assert missing.json()["code"] == "secret_not_found"


@pytest.mark.parametrize(
    ("name", "message"),
    [("lower_case", "upper-case letter"), ("1STARTS_WITH_DIGIT", "upper-case letter"),
     ("A" * 65, "upper-case letter"), ("PATH", "reserved"), ("PAW_DATASOURCES", "reserved"),
     ("LD_PRELOAD", "reserved")],
)  # fmt: skip
def test_bad_or_reserved_names_are_refused(alice_api, name, message):
    response = alice_api.put(f"/api/secrets/{name}", {"value": secret_value()}, format="json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "invalid"
    assert message in " ".join(body["fields"]["name"])
    assert not Secret.objects.filter(name=name).exists()


def test_an_empty_value_is_refused(alice_api):
    response = alice_api.put("/api/secrets/EMPTY", {"value": ""}, format="json")
    assert response.status_code == 400
    assert response.json()["code"] == "value_required"


def test_users_see_and_touch_only_their_own_secrets(alice_api, bob_api, alice):
    alice_api.put("/api/secrets/ALICE_ONLY", {"value": secret_value()}, format="json")
    secret_set(name="ALICE_ONLY", value=secret_value("global"))
    assert bob_api.get("/api/secrets").json() == {"secrets": []}
    assert bob_api.delete("/api/secrets/ALICE_ONLY").status_code == 404
    assert Secret.objects.filter(owner=alice, name="ALICE_ONLY").exists()


def test_anonymous_requests_are_refused(make_client):
    anonymous = make_client()
    assert anonymous.get("/api/secrets").status_code in (401, 403)
    assert anonymous.put("/api/secrets/X_KEY", {"value": "abcdef"}, format="json").status_code in (
        401,
        403,
    )


def test_the_operators_secrets_api_is_staff_only(alice_api):
    assert alice_api.get("/api/admin/secrets").status_code == 403
    response = alice_api.post(
        "/api/admin/secrets", {"name": "X_KEY", "value": secret_value()}, format="json"
    )
    assert response.status_code == 403
    assert not Secret.objects.filter(name="X_KEY").exists()


def test_operators_create_list_update_and_delete_secrets(operator_client, alice):
    value, new_value = secret_value("op"), secret_value("op2")
    created = operator_client.post(
        "/api/admin/secrets",
        {"name": "SHARED_KEY", "value": value, "description": "team"},
        format="json",
    )
    assert created.status_code == 201, created.json()
    body = created.json()
    assert body["scope"] == "global" and body["owner"] is None and "value" not in body
    for_alice = operator_client.post(
        "/api/admin/secrets",
        {"name": "SHARED_KEY", "scope": "user", "owner": "alice", "value": value},
        format="json",
    )
    assert for_alice.status_code == 201
    assert for_alice.json()["owner"] == "alice"
    again = operator_client.post(
        "/api/admin/secrets", {"name": "SHARED_KEY", "value": value}, format="json"
    )
    assert again.status_code == 409
    assert again.json()["code"] == "secret_exists"
    no_owner = operator_client.post(
        "/api/admin/secrets", {"name": "ORPHAN", "scope": "user", "value": value}, format="json"
    )
    assert no_owner.status_code == 400

    listed = operator_client.get("/api/admin/secrets").json()["secrets"]
    assert {(s["name"], s["owner"]) for s in listed} == {
        ("SHARED_KEY", None),
        ("SHARED_KEY", "alice"),
    }
    secret_id = body["id"]
    patched = operator_client.patch(
        f"/api/admin/secrets/{secret_id}", {"value": new_value}, format="json"
    )
    assert patched.status_code == 200
    assert Secret.objects.get(pk=secret_id).value == new_value
    assert operator_client.get(f"/api/admin/secrets/{secret_id}").json()["name"] == "SHARED_KEY"
    assert operator_client.delete(f"/api/admin/secrets/{secret_id}").status_code == 204
    assert operator_client.get(f"/api/admin/secrets/{secret_id}").status_code == 404


def test_one_person_keeps_at_most_the_allowed_number_of_secrets(alice_api, alice):
    from secrets_vault.services.secrets import USER_SECRETS_MAX

    for n in range(USER_SECRETS_MAX):
        secret_set(name=f"KEY_{n}", value=secret_value(), user=alice)
    response = alice_api.put("/api/secrets/ONE_MORE", {"value": secret_value()}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "too_many_secrets"
    assert not Secret.objects.filter(name="ONE_MORE").exists()
    # Replacing one is fine: it is not one more.
    response = alice_api.put("/api/secrets/KEY_0", {"value": secret_value()}, format="json")
    assert response.status_code == 200


def test_a_persons_secret_value_is_bounded(alice_api):
    from secrets_vault.services.secrets import USER_SECRET_VALUE_MAX_LENGTH

    value = secret_value() + "x" * USER_SECRET_VALUE_MAX_LENGTH
    response = alice_api.put("/api/secrets/HUGE", {"value": value}, format="json")
    assert response.status_code == 400 and response.json()["code"] == "value_too_long"
    assert not Secret.objects.filter(name="HUGE").exists()


def test_secret_changes_are_throttled_per_person(alice_api, bob_api, settings):
    settings.PAW_THROTTLE_UPLOADS = "3/min"
    for n in range(3):
        assert (
            alice_api.put(
                f"/api/secrets/T{n}", {"value": secret_value()}, format="json"
            ).status_code
            == 201
        )
    response = alice_api.put("/api/secrets/T3", {"value": secret_value()}, format="json")
    assert response.status_code == 429 and int(response["Retry-After"]) > 0
    assert alice_api.get("/api/secrets").status_code == 200  # reading is not throttled
    assert (
        bob_api.put("/api/secrets/T0", {"value": secret_value()}, format="json").status_code == 201
    )
