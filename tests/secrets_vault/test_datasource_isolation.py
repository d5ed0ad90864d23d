"""A datasource never reaches PAW's own database, and a person's secrets never say where
the operator's password goes: refused when written (operators' API, admin) and when
resolved for a run (placeholders may change later); resolved fields are checked and
quoted. Real PostgreSQL, SQLite files, a real listener on a loopback port."""

from __future__ import annotations

import contextlib
import os
import re
import socket
import sqlite3
import threading
from collections.abc import Iterator

import psycopg
import pytest
from django.conf import settings

from paw_project.errors import InvalidRequest
from secrets_vault import masking
from secrets_vault.models import Datasource
from secrets_vault.services import (
    datasource_test,
    sandbox_environment,
    secret_set,
)
from secrets_vault.services.knowledge import knowledge_entry_create
from tests.factories import datasource_made
from tests.pgdatasource import pg_datasource_settings
from tests.processes import database_settings
from tests.secrets_vault import leak_scan
from tests.secrets_vault.conftest import secret_value

pytestmark = pytest.mark.django_db
DATASOURCES_API = "/api/admin/datasources"


@pytest.fixture(autouse=True)
def _forget_resolved_values():
    """These tests put host names, ports and database names in secrets; once stored or
    resolved, the process masks them everywhere (``masking.secret_values_register``) and
    the suite's scan looks for them. Forget those plain values afterwards, so other tests'
    pages showing ``127.0.0.1`` are not taken for leaks; the real secret values (made by
    ``secret_value``: a 24-hex-digit tail) stay known, and looked for in this test."""
    with masking._known_lock, leak_scan._known_lock:
        before = set(masking._known) | set(leak_scan._known)
    yield
    real = re.compile(r"-[0-9a-f]{24}$")
    with masking._known_lock, leak_scan._known_lock:
        added = (set(masking._known) | set(leak_scan._known)) - before
        for value in (v for v in added if not real.search(v)):
            masking._known.pop(value, None)
            masking._known_for_logs.pop(value, None)
            leak_scan._known.discard(value)


def paw_database(host: str = "127.0.0.1") -> dict:
    """PAW's own (test) database as connection settings, reached through ``host``."""
    return {**database_settings(), "host": host}


#: Every spelling of this machine (the unspecified address too: a client reaches it).
THIS_MACHINE = ["127.0.0.1", "localhost", "::1", "[::1]", "LOCALHOST", "::ffff:127.0.0.1",
                "0.0.0.0", "127.1", "127.0.0.2", socket.gethostname()]  # fmt: skip  # noqa: S104


@pytest.mark.parametrize("host", THIS_MACHINE)
def test_the_operators_api_refuses_paws_own_postgresql_database(operator_client, host):
    created = operator_client.post(
        DATASOURCES_API,
        {"slug": "own", "name": "Own", "dialect": "postgresql", "connection": paw_database(host)},
        format="json",
    )
    assert created.status_code == 400, created.json()
    assert created.json()["code"] == "datasource_is_paw_database"
    assert "PAW's own database" in created.json()["detail"]
    assert not Datasource.objects.filter(slug="own").exists()


def test_an_update_to_paws_own_database_is_refused_and_changes_nothing(operator_client):
    other = pg_datasource_settings()
    assert datasource_made(slug="ds", name="DS", dialect="postgresql", connection=other)
    patched = operator_client.patch(
        f"{DATASOURCES_API}/ds", {"connection": paw_database("localhost")}, format="json"
    )
    assert patched.status_code == 400 and patched.json()["code"] == "datasource_is_paw_database"
    assert Datasource.objects.get(slug="ds").connection == other
    # Another database on the same server is fine.
    assert datasource_test(datasource=Datasource.objects.get(slug="ds"), user=None).ok


def test_sqlite_files_of_paw_are_refused_even_through_a_link(operator_client, tmp_path):
    var_dir = os.path.realpath(settings.VAR_DIR)
    own = os.path.join(var_dir, "paw.sqlite3")
    sqlite3.connect(own).close()
    workspace_file = os.path.join(os.path.realpath(settings.PAW_WORKSPACE_ROOT), "x.sqlite3")
    os.makedirs(os.path.dirname(workspace_file), exist_ok=True)
    sqlite3.connect(workspace_file).close()
    link = tmp_path / "innocent.sqlite3"
    link.symlink_to(own)
    for path in (own, workspace_file, str(link), f"{var_dir}/../{os.path.basename(var_dir)}/x"):
        response = operator_client.post(
            DATASOURCES_API,
            {"slug": "f", "name": "F", "dialect": "sqlite", "connection": {"database": path}},
            format="json",
        )
        assert response.status_code == 400, (path, response.json())
        assert response.json()["code"] == "datasource_is_paw_database"
    assert not Datasource.objects.exists()
    fine = tmp_path / "data.sqlite3"
    sqlite3.connect(fine).close()
    response = operator_client.post(
        DATASOURCES_API,
        {"slug": "f", "name": "F", "dialect": "sqlite", "connection": {"database": str(fine)}},
        format="json",
    )
    assert response.status_code == 201, response.json()


def test_the_admin_form_refuses_paws_own_database(operator_client):
    import json

    form = {
        "slug": "own", "name": "Own", "description": "", "dialect": "postgresql",
        "connection": json.dumps(paw_database()), "read_only": "on", "enabled": "on", "access": "teams",
    }  # fmt: skip
    page = operator_client.post("/admin/secrets_vault/datasource/add/", form)
    assert page.status_code == 200, "the form is shown again with its error"
    assert "PAW&#x27;s own database" in page.content.decode()
    assert not Datasource.objects.filter(slug="own").exists()


def test_a_run_never_gets_paws_database_when_a_placeholder_changes_later(alice, tmp_path):
    """Written pointing elsewhere, the operator's secret later points it at PAW's
    database: the run, the connection test and an example check are all refused."""
    secret_set(name="DS_DATABASE", value="somewhere_else")
    datasource = datasource_made(
        slug="later", name="Later", dialect="postgresql",
        connection={**paw_database(), "database": "{secret:DS_DATABASE}"},
    )  # fmt: skip
    secret_set(name="DS_DATABASE", value=database_settings()["database"])
    with pytest.raises(InvalidRequest) as refused:
        sandbox_environment(user=alice, datasource_slugs=["later"])
    assert refused.value.code == "datasource_is_paw_database"
    result = datasource_test(datasource=datasource, user=None)
    assert not result.ok and "PAW's own database" in result.message
    with pytest.raises(InvalidRequest) as example:
        knowledge_entry_create(
            datasource=datasource, kind="example", title="Sessions",
            sql="SELECT session_key FROM django_session", user=None,
        )  # fmt: skip
    assert example.value.code == "datasource_is_paw_database"

    # SQLite: a path placeholder that later names PAW's database file.
    data = tmp_path / "data.sqlite3"
    sqlite3.connect(data).close()
    secret_set(name="DS_FILE", value=str(data))
    datasource_made(
        slug="file", name="File", dialect="sqlite", connection={"database": "{secret:DS_FILE}"}
    )
    assert sandbox_environment(user=alice, datasource_slugs=["file"])
    own = os.path.join(os.path.realpath(settings.VAR_DIR), "paw.sqlite3")
    sqlite3.connect(own).close()
    secret_set(name="DS_FILE", value=own)
    with pytest.raises(InvalidRequest) as refused:
        sandbox_environment(user=alice, datasource_slugs=["file"])
    assert refused.value.code == "datasource_is_paw_database"


# --- A person's secrets never redirect the operator's password -------------------------


@contextlib.contextmanager
def listener() -> Iterator[tuple[int, list[str]]]:
    """A real TCP listener on a free loopback port: ``(port, peers)``, each connection
    that reached it recorded (and closed at once)."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    peers: list[str] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except OSError:
                continue
            peers.append(f"{peer[0]}:{peer[1]}")
            conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], peers
    finally:
        stop.set()
        thread.join(5)
        server.close()


@pytest.fixture
def plain_words_as_secrets():
    """This test makes the test server's host and database name secrets: the leak scan
    forgets them afterwards, or every later response naming them would be a leak."""
    real = pg_datasource_settings()
    yield real
    leak_scan.forget(real["host"], real["database"])


def test_a_users_own_secret_cannot_redirect_the_host_and_the_password_never_reaches_it(
    alice, plain_words_as_secrets
):
    real = plain_words_as_secrets
    password = secret_value("op-pw")
    secret_set(name="TPL_PW", value=password)
    secret_set(name="TPL_HOST", value=real["host"])
    secret_set(name="TPL_DB", value=real["database"])
    datasource_made(
        slug="tpl", name="Tpl", dialect="postgresql",
        connection={**real, "host": "{secret:TPL_HOST}", "database": "{secret:TPL_DB}",
                    "password": "{secret:TPL_PW}"},
    )  # fmt: skip
    with listener() as (port, peers):
        # Alice's own secrets of the same names: a host list, another database.
        secret_set(name="TPL_HOST", value=f"127.0.0.1:{port},{real['host']}", user=alice)
        secret_set(name="TPL_DB", value="alices_own_db", user=alice)
        environment = sandbox_environment(user=alice, datasource_slugs=["tpl"])
        url = environment.env["PAW_DATASOURCE_TPL_URL"]
        assert str(port) not in url
        with psycopg.connect(url, connect_timeout=5) as conn:
            name = conn.execute("SELECT current_database()").fetchone()[0]
        assert name == real["database"], "the operator's database, not the user's"
        assert peers == [], "someone connected to the user's listener"


def test_a_users_own_password_still_resolves_first(alice):
    own, shared = secret_value("own-pw"), secret_value("shared-pw")
    secret_set(name="MY_DB_PW", value=shared)
    secret_set(name="MY_DB_PW", value=own, user=alice)
    datasource_made(
        slug="mine", name="Mine", dialect="postgresql",
        connection={**pg_datasource_settings(), "password": "{secret:MY_DB_PW}"},
    )  # fmt: skip
    url = sandbox_environment(user=alice, datasource_slugs=["mine"]).env["PAW_DATASOURCE_MINE_URL"]
    assert own in url and shared not in url


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("host", "127.0.0.1:9,127.0.0.1"),
        ("host", "evil/../x"),
        ("host", "a@b"),
        ("host", "[::1]:5432"),
        ("port", "5432,9"),
        ("port", "70000"),
        ("port", "5432/x"),
    ],
)
def test_resolved_fields_that_would_add_url_parts_are_refused(alice, field, value):
    with listener() as (port, peers):
        value = value.replace(":9", f":{port}").replace(",9", f",{port}")
        secret_set(name="DS_PART", value=value)
        datasource_made(
            slug="bad", name="Bad", dialect="postgresql",
            connection={**pg_datasource_settings(), field: "{secret:DS_PART}"},
        )  # fmt: skip
        with pytest.raises(InvalidRequest) as refused:
            sandbox_environment(user=alice, datasource_slugs=["bad"])
        assert refused.value.code == "invalid_connection"
        assert value not in refused.value.detail, "an error never shows a secret's value"
        assert peers == []


def test_user_and_database_are_quoted_so_they_cannot_add_url_parts(alice):
    secret_set(name="DS_USER", value="postgres@127.0.0.1:1/x?host=evil")
    secret_set(name="DS_NAME", value="db?host=127.0.0.1&port=1#x")
    datasource_made(
        slug="quoted", name="Quoted", dialect="postgresql",
        connection={**pg_datasource_settings(), "user": "{secret:DS_USER}",
                    "database": "{secret:DS_NAME}"},
    )  # fmt: skip
    url = sandbox_environment(user=alice, datasource_slugs=["quoted"]).env[
        "PAW_DATASOURCE_QUOTED_URL"
    ]
    parsed = psycopg.conninfo.conninfo_to_dict(url)
    assert parsed["user"] == "postgres@127.0.0.1:1/x?host=evil"
    assert parsed["dbname"] == "db?host=127.0.0.1&port=1#x"
    assert parsed["host"] == pg_datasource_settings()["host"] and "port=1" not in str(
        parsed.get("port")
    )


def test_connection_options_cannot_name_another_host(operator_client):
    response = operator_client.post(
        DATASOURCES_API,
        {"slug": "opt", "name": "Opt", "dialect": "postgresql",
         "connection": {**pg_datasource_settings(), "options": {"host": "127.0.0.1"}}},
        format="json",
    )  # fmt: skip
    assert response.status_code == 400 and "Option" in response.json()["detail"]
