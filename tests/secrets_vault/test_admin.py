"""The admin: secret values are write-only and never on a page; datasources refuse
literal passwords; "Test connection" really connects (SQLite, PostgreSQL, MariaDB)."""

from __future__ import annotations

import sqlite3
from urllib.parse import urlsplit

from secrets_vault.models import CustomProvider, Datasource, Secret
from secrets_vault.services import datasource_create, datasource_test, secret_set
from tests.mariadb import mariadb_settings
from tests.pgdatasource import pg_datasource_settings
from tests.processes import free_port
from tests.secrets_vault.conftest import secret_value

SECRETS = "/admin/secrets_vault/secret/"
DATASOURCES = "/admin/secrets_vault/datasource/"


def test_an_operator_adds_a_global_secret_in_the_admin_and_it_is_stored_encrypted(
    operator_client,
):
    value = secret_value("admin-add")
    page = operator_client.get(f"{SECRETS}add/")
    assert page.status_code == 200
    assert b"Leave blank to keep the current value." in page.content
    response = operator_client.post(
        f"{SECRETS}add/",
        {"name": "SHARED_DB_PW", "scope": "global", "owner": "", "new_value": value,
         "description": "shared"},
    )  # fmt: skip
    assert response.status_code == 302, response.content.decode()[:2000]
    secret = Secret.objects.get(name="SHARED_DB_PW")
    assert secret.value == value and secret.scope == "global"


def test_a_new_secret_needs_a_value_and_a_blank_value_keeps_the_current_one(operator_client, alice):
    refused = operator_client.post(
        f"{SECRETS}add/", {"name": "NO_VALUE", "scope": "global", "owner": "", "new_value": ""}
    )
    assert refused.status_code == 200
    assert b"A new secret needs a value." in refused.content
    assert not Secret.objects.filter(name="NO_VALUE").exists()

    value, new_value = secret_value("keep"), secret_value("replace")
    secret, _ = secret_set(name="ALICE_KEY", value=value, user=alice)
    change = f"{SECRETS}{secret.pk}/change/"
    page = operator_client.get(change)
    assert page.status_code == 200 and b"ALICE_KEY" in page.content
    form = {"name": "ALICE_KEY", "scope": "user", "owner": str(alice.pk), "new_value": "",
            "description": "edited"}  # fmt: skip
    assert operator_client.post(change, form).status_code == 302
    secret.refresh_from_db()
    assert secret.value == value and secret.description == "edited"
    assert operator_client.post(change, {**form, "new_value": new_value}).status_code == 302
    secret.refresh_from_db()
    assert secret.value == new_value
    # The list, the history and the delete confirmation show names, never values.
    for path in (SECRETS, f"{SECRETS}{secret.pk}/history/", f"{SECRETS}{secret.pk}/delete/"):
        assert operator_client.get(path).status_code == 200


def test_the_admin_refuses_a_reserved_name_and_a_user_secret_without_owner(operator_client):
    for form in (
        {"name": "PATH", "scope": "global", "owner": "", "new_value": secret_value()},
        {"name": "FINE_NAME", "scope": "user", "owner": "", "new_value": secret_value()},
    ):
        response = operator_client.post(f"{SECRETS}add/", form)
        assert response.status_code == 200
        assert b"errornote" in response.content
    assert not Secret.objects.exists()


def test_the_datasource_admin_refuses_a_literal_password(operator_client):
    form = {"slug": "sales", "name": "Sales", "description": "", "dialect": "postgresql",
            "connection": '{"host": "db", "database": "sales", "password": "plain-pw-123"}',
            "read_only": "on", "enabled": "on", "access": "teams"}  # fmt: skip
    refused = operator_client.post(f"{DATASOURCES}add/", form)
    assert refused.status_code == 200
    assert b"A literal password is not accepted" in refused.content
    assert not Datasource.objects.exists()
    form["connection"] = '{"host": "db", "database": "sales", "password": "{secret:SALES_PW}"}'
    assert operator_client.post(f"{DATASOURCES}add/", form).status_code == 302
    datasource = Datasource.objects.get(slug="sales")
    page = operator_client.get(f"{DATASOURCES}{datasource.pk}/change/")
    assert b"PAW_DATASOURCE_SALES_URL" in page.content


def test_custom_provider_pages(operator_client):
    form = {"name": "ollama", "label": "Ollama", "base_url": "http://127.0.0.1:11434/v1",
            "key_secret_name": "", "known_models": '["llama3.2"]', "default_model": "",
            "enabled": "on"}  # fmt: skip
    assert operator_client.post("/admin/secrets_vault/customprovider/add/", form).status_code == 302
    assert CustomProvider.objects.get(name="ollama").known_models == ["llama3.2"]
    taken = operator_client.post(
        "/admin/secrets_vault/customprovider/add/", {**form, "name": "openai"}
    )
    assert b"built-in provider" in taken.content
    assert operator_client.get("/admin/secrets_vault/customprovider/").status_code == 200


# --- Test connection ---------------------------------------------------------------------


def run_test_action(client, *datasources: Datasource) -> str:
    response = client.post(
        DATASOURCES,
        {"action": "test_connection", "_selected_action": [d.pk for d in datasources]},
        follow=True,
    )
    assert response.status_code == 200
    return response.content.decode()


def test_test_connection_really_connects_to_sqlite_and_postgresql(operator_client, tmp_path):
    path = tmp_path / "reports.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE a (x)")
        db.execute("CREATE TABLE b (y)")
    secret_set(name="REPORTS_PG_PW", value=secret_value("pg-pw"))
    files = datasource_create(
        slug="reports", name="Reports", dialect="sqlite", connection={"database": str(path)}
    )
    postgres = datasource_create(
        slug="warehouse", name="Warehouse", dialect="postgresql", read_only=True,
        connection={**pg_datasource_settings(), "password": "{secret:REPORTS_PG_PW}"},
    )  # fmt: skip
    page = run_test_action(operator_client, files, postgres)
    assert "Test connection of reports: Connected to SQLite" in page and "2 table(s)" in page
    assert "Test connection of warehouse: Connected to PostgreSQL" in page and "(read-only)" in page


def test_test_connection_reports_failures_without_secret_values(operator_client, tmp_path):
    hidden = secret_value("in-path")
    secret_set(name="PATH_PART", value=hidden)
    missing_file = datasource_create(
        slug="gone", name="Gone", dialect="sqlite",
        connection={"database": str(tmp_path / "{secret:PATH_PART}.sqlite3")},
    )  # fmt: skip
    closed_port = datasource_create(
        slug="down", name="Down", dialect="postgresql",
        connection={**pg_datasource_settings(), "port": free_port()},
    )  # fmt: skip
    no_secret = datasource_create(
        slug="nokey", name="No key", dialect="postgresql",
        connection={**pg_datasource_settings(), "password": "{secret:NEVER_SET}"},
    )  # fmt: skip
    page = run_test_action(operator_client, missing_file, closed_port, no_secret)
    assert (
        "Test connection of gone: Connection failed: no such file" in page
        and "[secret:PATH_PART]" in page
    )
    assert "Test connection of down: Connection failed:" in page
    assert "No secret named NEVER_SET" in page
    assert not (tmp_path / f"{hidden}.sqlite3").exists(), "a test never creates a database"


def test_test_connection_reaches_mariadb_through_the_operators_api(
    operator_client, operator, mariadb_url
):
    server = urlsplit(mariadb_url)
    secret_set(name="MARIA_PW", value=secret_value("maria"), user=operator)
    datasource_create(
        slug="maria", name="MariaDB", dialect="mysql",
        connection={"host": server.hostname, "port": server.port or 3306,
                    "database": server.path.lstrip("/"), "user": server.username or "root",
                    "password": "{secret:MARIA_PW}"},
    )  # fmt: skip
    result = operator_client.post("/api/admin/datasources/maria/test").json()
    # root has no password here; a wrong one is refused: either way it really connected.
    assert "Access denied" in result["message"] or "Its user can do more" in result["message"]
    datasource = Datasource.objects.get(slug="maria")
    datasource.connection.pop("password")
    datasource.save()
    # As root, the read-only datasource's test says what root can do beyond reading, and
    # fails: PAW would not save it so (tests/secrets_vault/test_datasource_privileges.py).
    as_root = datasource_test(datasource=datasource, user=operator)
    assert not as_root.ok and "FILE" in as_root.privileges.refused, as_root
    reader = mariadb_settings()  # a user that can only read, on the tests' own database
    datasource.connection.update(user=reader["user"], database=reader["database"])
    datasource.save()
    as_reader = datasource_test(datasource=datasource, user=operator)
    assert as_reader.ok and as_reader.message.endswith("Its user can only read."), as_reader
