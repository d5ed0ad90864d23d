"""{secret:NAME} placeholders: resolved recursively, the user's own secret first, with
errors that name what is missing and never show a value."""

from __future__ import annotations

import pytest

from paw_project.errors import InvalidRequest
from secrets_vault.services import placeholders_resolve, secret_set
from tests.secrets_vault.conftest import secret_value


@pytest.fixture
def values(alice):
    own, shared, token = secret_value("own"), secret_value("shared"), secret_value("tok")
    secret_set(name="DB_PASSWORD", value=own, user=alice)
    secret_set(name="DB_PASSWORD", value=shared)
    secret_set(name="API_TOKEN", value=token)
    return {"own": own, "shared": shared, "token": token}


def test_placeholders_resolve_in_nested_dicts_lists_and_strings(alice, values):
    obj = {
        "password": "{secret:DB_PASSWORD}",
        "options": {"headers": ["Bearer {secret:API_TOKEN}", 5, None]},
        "dsn": "user:{secret:DB_PASSWORD}@host/{secret:API_TOKEN}",
        "plain": "no placeholder {secret:lowercase}",
    }
    resolved = placeholders_resolve(user=alice, obj=obj)
    assert resolved.value == {
        "password": values["own"],
        "options": {"headers": [f"Bearer {values['token']}", 5, None]},
        "dsn": f"user:{values['own']}@host/{values['token']}",
        "plain": "no placeholder {secret:lowercase}",
    }
    assert resolved.secret_values == {"DB_PASSWORD": values["own"], "API_TOKEN": values["token"]}
    assert obj["password"] == "{secret:DB_PASSWORD}", "the input must not change"


def test_the_users_own_secret_comes_before_a_global_one(alice, bob, values):
    assert placeholders_resolve(user=alice, obj="{secret:DB_PASSWORD}").value == values["own"]
    assert placeholders_resolve(user=bob, obj="{secret:DB_PASSWORD}").value == values["shared"]
    assert placeholders_resolve(user=None, obj="{secret:DB_PASSWORD}").value == values["shared"]


def test_a_missing_name_is_an_error_naming_it_and_no_value(alice, values):
    with pytest.raises(InvalidRequest) as caught:
        placeholders_resolve(
            user=alice,
            obj={"a": "{secret:DB_PASSWORD}", "b": ["{secret:NOPE_ONE}", "{secret:NOPE_TWO}"]},
        )
    error = caught.value
    assert error.code == "secret_missing"
    assert error.extra["names"] == ["NOPE_ONE", "NOPE_TWO"]
    assert "NOPE_ONE" in error.detail and "NOPE_TWO" in error.detail
    assert values["own"] not in error.detail and values["shared"] not in error.detail


def test_another_users_secret_is_never_used(bob, alice):
    secret_set(name="ONLY_ALICE", value=secret_value(), user=alice)
    with pytest.raises(InvalidRequest) as caught:
        placeholders_resolve(user=bob, obj="{secret:ONLY_ALICE}")
    assert caught.value.code == "secret_missing"


def test_a_value_containing_a_placeholder_is_not_expanded_again(alice, values):
    tricky = "pre-{secret:API_TOKEN}"
    secret_set(name="TRICKY", value=tricky, user=alice)
    assert (
        placeholders_resolve(user=alice, obj="x{secret:TRICKY}").value == "xpre-{secret:API_TOKEN}"
    )
