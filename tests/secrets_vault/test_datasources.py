"""Datasources: passwords only as placeholders, validation of a run's slugs, URLs, the
users' listing and the operators' CRUD."""

from __future__ import annotations

import pytest

from paw_project.errors import InvalidRequest
from secrets_vault.connections import connection_url
from secrets_vault.models import Datasource
from secrets_vault.services import datasources_validate
from tests.factories import datasource_made

PG = {"host": "db.internal", "port": 5432, "database": "sales", "user": "reader"}


def make(slug: str, **fields) -> Datasource:
    defaults = {"name": slug.title(), "dialect": "postgresql", "connection": dict(PG)}
    return datasource_made(slug=slug, **{**defaults, **fields})


@pytest.mark.django_db
def test_a_literal_password_is_refused_with_a_clear_error():
    with pytest.raises(InvalidRequest) as caught:
        make("sales", connection={**PG, "password": "hunter2-literal"})
    detail = caught.value.detail
    assert "literal password" in detail and "{secret:DB_PASSWORD}" in detail
    assert "hunter2-literal" not in detail
    assert "connection" in caught.value.extra["fields"]
    assert not Datasource.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "connection",
    [
        {**PG, "password": "prefix-{secret:DB_PASSWORD}"},
        {**PG, "options": {"sslpassword": "literal-ssl-pw"}},
        {**PG, "password": ["{secret:DB_PASSWORD}"]},
    ],
)
def test_a_password_must_be_exactly_one_placeholder(connection):
    with pytest.raises(InvalidRequest, match="literal password"):
        make("sales", connection=connection)


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("dialect", "connection", "message"),
    [
        ("postgresql", {**PG, "hostname": "x"}, "Unknown key"),
        ("postgresql", {**PG, "port": "eighty"}, "port"),
        ("postgresql", {"host": "x"}, "database"),
        ("sqlite", {"database": "relative/file.db"}, "absolute path"),
        ("sqlite", {}, "absolute path"),
        ("postgresql", ["not", "an", "object"], "JSON object"),
        ("postgresql", {**PG, "options": {"nested": {"a": 1}}}, "plain values"),
    ],
)
def test_bad_connection_settings_are_refused(dialect, connection, message):
    with pytest.raises(InvalidRequest, match=message):
        make("bad", dialect=dialect, connection=connection)


@pytest.mark.django_db
def test_a_placeholder_password_is_accepted():
    datasource = make("sales", connection={**PG, "password": "{secret:SALES_DB_PASSWORD}"})
    assert datasource.env_name == "PAW_DATASOURCE_SALES_URL"


@pytest.mark.django_db
def test_two_slugs_cannot_share_one_sandbox_variable():
    make("sales-eu")
    with pytest.raises(InvalidRequest, match="PAW_DATASOURCE_SALES_EU_URL"):
        make("sales_eu")


@pytest.mark.django_db
def test_a_runs_slugs_are_validated_naming_unknown_and_disabled_ones(alice):
    make("sales")
    make("archive", enabled=False)
    assert datasources_validate(slugs=["sales", "sales"], user=alice) == ["sales"]
    assert datasources_validate(slugs=[], user=alice) == []
    with pytest.raises(InvalidRequest) as caught:
        datasources_validate(slugs=["sales", "archive", "nope"], user=alice)
    assert caught.value.code == "unknown_datasource"
    assert caught.value.status_code == 400
    assert caught.value.extra["slugs"] == ["archive", "nope"]
    assert "archive" in caught.value.detail and "nope" in caught.value.detail
    with pytest.raises(InvalidRequest):
        datasources_validate(slugs="sales", user=alice)


def test_urls_encode_credentials_and_make_postgresql_read_only():
    url = connection_url(
        dialect="postgresql",
        connection={**PG, "password": "p@ss/w:rd", "options": {"sslmode": "require"}},
        read_only=True,
    )
    assert url == (
        "postgresql://reader:p%40ss%2Fw%3Ard@db.internal:5432/sales"
        "?sslmode=require&options=-c%20default_transaction_read_only%3Don"
    )
    assert connection_url(dialect="mysql", connection=PG, read_only=False) == (
        "mysql://reader@db.internal:5432/sales"
    )
    assert (
        connection_url(
            dialect="sqlite", connection={"database": "/srv/data/my db.sqlite3"}, read_only=True
        )
        == "sqlite:////srv/data/my%20db.sqlite3?mode=ro"
    )


def test_users_list_enabled_datasources_without_connection_settings(alice_api):
    make(
        "sales", description="Orders and customers", connection={**PG, "password": "{secret:PW_X}"}
    )
    make("archive", enabled=False)
    body = alice_api.get("/api/datasources").json()
    assert body == {
        "datasources": [
            {"slug": "sales", "name": "Sales", "description": "Orders and customers",
             "dialect": "postgresql"}
        ]
    }  # fmt: skip


def test_the_operators_datasource_api_is_staff_only(alice_api):
    assert alice_api.get("/api/admin/datasources").status_code == 403
    response = alice_api.post(
        "/api/admin/datasources",
        {"slug": "x", "name": "X", "dialect": "sqlite", "connection": {"database": "/x.db"}},
        format="json",
    )
    assert response.status_code == 403


def test_operators_create_update_and_delete_datasources(operator_client):
    literal = operator_client.post(
        "/api/admin/datasources",
        {"slug": "sales", "name": "Sales", "dialect": "postgresql",
         "connection": {**PG, "password": "not-a-placeholder"}},
        format="json",
    )  # fmt: skip
    assert literal.status_code == 400
    assert "literal password" in literal.json()["detail"]
    created = operator_client.post(
        "/api/admin/datasources",
        {"slug": "sales", "name": "Sales", "dialect": "postgresql",
         "connection": {**PG, "password": "{secret:SALES_PW}"}},
        format="json",
    )  # fmt: skip
    assert created.status_code == 201, created.json()
    assert created.json()["env"] == "PAW_DATASOURCE_SALES_URL"
    assert created.json()["read_only"] is True
    again = operator_client.post(
        "/api/admin/datasources",
        {"slug": "sales", "name": "Sales", "dialect": "postgresql", "connection": PG},
        format="json",
    )
    assert again.status_code == 409
    patched = operator_client.patch(
        "/api/admin/datasources/sales", {"enabled": False, "description": "old"}, format="json"
    )
    assert patched.status_code == 200
    assert patched.json()["enabled"] is False
    refused = operator_client.patch(
        "/api/admin/datasources/sales",
        {"connection": {**PG, "password": "plain"}},
        format="json",
    )
    assert refused.status_code == 400
    assert Datasource.objects.get(slug="sales").connection["password"] == "{secret:SALES_PW}"
    assert operator_client.delete("/api/admin/datasources/sales").status_code == 204
    assert operator_client.get("/api/admin/datasources/sales").status_code == 404


@pytest.mark.parametrize(
    "hosts",
    ["api.internal", ["a b"], ["api.internal:99999"], ["http://x"], ["x:1"] * 21, [3]],
)
def test_a_datasources_allowed_hosts_are_checked_and_nothing_is_saved(operator_client, hosts):
    response = operator_client.post(
        "/api/admin/datasources",
        {"slug": "lite", "name": "Lite", "dialect": "sqlite",
         "connection": {"database": "/srv/x.db"}, "allowed_hosts": hosts},
        format="json",
    )  # fmt: skip
    assert response.status_code == 400, response.json()
    assert not Datasource.objects.filter(slug="lite").exists()


def test_a_datasources_allowed_hosts_are_kept_and_shown(operator_client):
    hosts = ["api.internal:443", "*.corp.test", "10.1.2.3"]
    created = operator_client.post(
        "/api/admin/datasources",
        {"slug": "lite", "name": "Lite", "dialect": "sqlite",
         "connection": {"database": "/srv/x.db"}, "allowed_hosts": hosts},
        format="json",
    )  # fmt: skip
    assert created.status_code == 201, created.json()
    assert created.json()["allowed_hosts"] == hosts
    assert Datasource.objects.get(slug="lite").allowed_hosts == hosts
