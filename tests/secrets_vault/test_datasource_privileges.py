"""The database as the second wall: a read-only datasource's database user must only read.

Saving (API and admin) and testing a read-only PostgreSQL or MariaDB datasource look at
what its user can do beyond reading, on the real servers: a superuser, a member of
``pg_read_server_files`` / ``pg_write_server_files`` / ``pg_execute_server_program`` /
``pg_signal_backend``, or a MariaDB user with ``FILE``, ``SUPER``, ``PROCESS`` or any
write privilege is refused (400 ``datasource_user_privileged``, nothing saved) unless the
operator accepts it explicitly, which the admin then shows in red.
"""

from __future__ import annotations

import contextlib

import psycopg
import pytest

from secrets_vault.models import Datasource
from tests.mariadb import USER_HOSTS, _connect, drop_users, mariadb_settings
from tests.pgdatasource import pg_datasource_settings
from tests.processes import free_port

API = "/api/admin/datasources"


def _pg_role(name: str, *member_of: str) -> str:
    """A login role of the test server that belongs to ``member_of`` (made once)."""
    server = pg_datasource_settings(reader=False)
    with psycopg.connect(
        host=server["host"], port=server["port"], user=server["user"], dbname="postgres",
        autocommit=True,
    ) as conn:  # fmt: skip
        with contextlib.suppress(psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation):
            conn.execute(f"CREATE ROLE {name} LOGIN")
        conn.execute(f"GRANT pg_read_all_data TO {name}")
        for role in member_of:
            conn.execute(f"GRANT {role} TO {name}")
    return name


def _create(client, slug: str, dialect: str, connection: dict, **more):
    return client.post(
        API,
        {"slug": slug, "name": slug, "dialect": dialect, "connection": connection, **more},
        format="json",
    )


@pytest.mark.django_db
def test_a_read_only_postgresql_datasource_as_the_superuser_is_refused_and_nothing_saved(
    operator_client,
):
    response = _create(operator_client, "pg", "postgresql", pg_datasource_settings(reader=False))
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == "datasource_user_privileged"
    assert body["privileges"] == ["superuser"]
    assert "Its user can do more than read: superuser." in body["detail"]
    assert "allow_privileged_user" in body["fields"]
    assert not Datasource.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    "role",
    [
        "pg_read_server_files",
        "pg_write_server_files",
        "pg_execute_server_program",
        "pg_signal_backend",
    ],
)
def test_a_member_of_a_role_that_reaches_the_server_is_refused(operator_client, role):
    user = _pg_role(f"paw_test_{role.removeprefix('pg_')}", role)
    connection = {**pg_datasource_settings(), "user": user}
    response = _create(operator_client, "pg", "postgresql", connection)
    assert response.status_code == 400, response.json()
    assert response.json()["privileges"] == [f"member of {role}"]
    assert not Datasource.objects.exists()


@pytest.mark.django_db
def test_a_reader_is_saved_and_what_was_checked_is_shown(operator_client):
    response = _create(operator_client, "pg", "postgresql", pg_datasource_settings())
    assert response.status_code == 201, response.json()
    body = response.json()
    assert body["user_privileges"] == {"refused": [], "noted": []}
    assert body["privileges_checked_at"] is not None
    tested = operator_client.post(f"{API}/pg/test").json()
    assert tested["ok"] is True and tested["message"].endswith("Its user can only read.")


@pytest.mark.django_db
def test_accepting_a_privileged_user_is_explicit_and_the_admin_shows_it_in_red(operator_client):
    refused = _create(operator_client, "pg", "postgresql", pg_datasource_settings(reader=False))
    assert refused.status_code == 400
    accepted = _create(
        operator_client, "pg", "postgresql", pg_datasource_settings(reader=False),
        allow_privileged_user=True,
    )  # fmt: skip
    assert accepted.status_code == 201, accepted.json()
    assert accepted.json()["user_privileges"]["refused"] == ["superuser"]
    tested = operator_client.post(f"{API}/pg/test").json()
    assert tested["ok"] is True and "Accepted anyway" in tested["message"]
    datasource = Datasource.objects.get(slug="pg")
    page = operator_client.get(f"/admin/secrets_vault/datasource/{datasource.pk}/change/")
    assert b'class="errornote paw-privileged">Accepted anyway (unsafe): superuser' in page.content
    # Taking the acceptance back: the next save is refused again, and nothing changes.
    taken = operator_client.patch(f"{API}/pg", {"allow_privileged_user": False}, format="json")
    assert taken.status_code == 400 and taken.json()["code"] == "datasource_user_privileged"
    assert Datasource.objects.get(slug="pg").allow_privileged_user is True


@pytest.mark.django_db
def test_a_writable_datasource_is_not_checked_and_turning_it_read_only_is(operator_client):
    created = _create(
        operator_client, "pg", "postgresql", pg_datasource_settings(reader=False), read_only=False
    )
    assert created.status_code == 201 and created.json()["privileges_checked_at"] is None
    to_read_only = operator_client.patch(f"{API}/pg", {"read_only": True}, format="json")
    assert to_read_only.status_code == 400
    assert to_read_only.json()["code"] == "datasource_user_privileged"
    assert Datasource.objects.get(slug="pg").read_only is False


@pytest.mark.django_db
def test_a_datasource_that_cannot_be_reached_is_saved_unchecked_and_tested_later(
    operator_client,
):
    connection = {**pg_datasource_settings(reader=False), "port": free_port()}
    created = _create(operator_client, "pg", "postgresql", connection)
    assert created.status_code == 201 and created.json()["privileges_checked_at"] is None
    datasource = Datasource.objects.get(slug="pg")
    page = operator_client.get(f"/admin/secrets_vault/datasource/{datasource.pk}/change/")
    assert b"Not checked yet: it is checked when saved or tested." in page.content
    # Once the database answers, its test says what the user can do, and records it.
    datasource.connection = pg_datasource_settings(reader=False)
    datasource.save()
    tested = operator_client.post(f"{API}/pg/test").json()
    assert tested["ok"] is False and "superuser" in tested["message"]
    assert "PAW refuses to save this read-only datasource" in tested["message"]
    datasource.refresh_from_db()
    assert datasource.user_privileges["refused"] == ["superuser"]


@pytest.mark.django_db
def test_the_admin_form_refuses_a_privileged_user_with_the_reason(operator_client):
    response = operator_client.post(
        "/admin/secrets_vault/datasource/add/",
        {
            "slug": "pg", "name": "PG", "description": "", "dialect": "postgresql",
            "connection": __import__("json").dumps(pg_datasource_settings(reader=False)),
            "read_only": "on", "enabled": "on", "access": "teams", "allowed_hosts": "[]",
            "knowledge-TOTAL_FORMS": "0", "knowledge-INITIAL_FORMS": "0",
        },
    )  # fmt: skip
    assert response.status_code == 200  # the form again, with the error
    assert b"Its user can do more than read: superuser." in response.content
    assert not Datasource.objects.exists()


@pytest.fixture
def maria_writer(mariadb):
    """A MariaDB user that may read and INSERT on the test database."""
    server = _connect(database=None)
    with contextlib.closing(server), server.cursor() as cursor:
        for host in USER_HOSTS:
            cursor.execute(f"CREATE USER IF NOT EXISTS 'paw_test_writer'@'{host}'")
            cursor.execute(
                f"GRANT SELECT, INSERT ON `{mariadb['database']}`.* TO 'paw_test_writer'@'{host}'"
            )
    return {**mariadb, "user": "paw_test_writer"}


@pytest.mark.django_db
def test_mariadb_users_beyond_select_are_refused_and_a_reader_is_saved(
    operator_client, mariadb, maria_writer
):
    as_root = _create(operator_client, "maria", "mysql", mariadb_settings(reader=False))
    assert as_root.status_code == 400
    assert {"FILE", "SUPER", "PROCESS", "INSERT", "DROP"} <= set(as_root.json()["privileges"])
    as_writer = _create(operator_client, "maria", "mysql", maria_writer)
    assert as_writer.status_code == 400 and as_writer.json()["privileges"] == ["INSERT"]
    assert not Datasource.objects.exists()
    as_reader = _create(operator_client, "maria", "mysql", mariadb)
    assert as_reader.status_code == 201, as_reader.json()
    assert as_reader.json()["user_privileges"] == {"refused": [], "noted": []}


def _pg_superuser_role_member(*, inherit: bool) -> str:
    """A login role with nothing but reading, a member of a NOLOGIN superuser role."""
    server = pg_datasource_settings(reader=False)
    name = "paw_test_sneaky" + ("" if inherit else "_noinherit")
    with psycopg.connect(
        host=server["host"], port=server["port"], user=server["user"], dbname="postgres",
        autocommit=True,
    ) as conn:  # fmt: skip
        for statement in (
            "CREATE ROLE paw_test_admin SUPERUSER NOLOGIN",
            f"CREATE ROLE {name} LOGIN {'INHERIT' if inherit else 'NOINHERIT'}",
        ):
            with contextlib.suppress(
                psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation
            ):
                conn.execute(statement)
        conn.execute(f"GRANT pg_read_all_data TO {name}")
        conn.execute(f"GRANT paw_test_admin TO {name}")
    return name


@pytest.mark.django_db
@pytest.mark.parametrize("inherit", [True, False], ids=["inherit", "noinherit"])
def test_a_member_of_a_superuser_role_is_refused(operator_client, inherit):
    """Found by the adversarial pass: ``SET ROLE`` makes such a member a superuser."""
    user = _pg_superuser_role_member(inherit=inherit)
    response = _create(
        operator_client, "pg", "postgresql", {**pg_datasource_settings(), "user": user}
    )
    assert response.status_code == 400, response.json()
    assert response.json()["privileges"] == ["member of the superuser role paw_test_admin"]


@pytest.fixture
def maria_role_users(mariadb):
    """MariaDB users that can only SELECT by their own grants, and more through a default
    role, a nested role, ``PUBLIC``, a grant option or a routine grant (the adversarial
    pass found each saved as "can only read"). Dropped afterwards."""
    database = mariadb["database"]
    users = {
        "paw_test_role_user": "FILE, INSERT",
        "paw_test_nested_user": "FILE",
        "paw_test_option_user": None,
    }
    statements = [
        "CREATE ROLE IF NOT EXISTS paw_test_role",
        "CREATE ROLE IF NOT EXISTS paw_test_outer",
        "CREATE ROLE IF NOT EXISTS paw_test_inner",
        "GRANT FILE ON *.* TO paw_test_role",
        f"GRANT INSERT ON `{database}`.* TO paw_test_role",
        "GRANT FILE ON *.* TO paw_test_inner",
        "GRANT paw_test_inner TO paw_test_outer",
    ]
    statements += [
        f"CREATE USER IF NOT EXISTS '{user}'@'{host}'" for user in users for host in USER_HOSTS
    ]
    for host in USER_HOSTS:
        statements += [
            f"GRANT SELECT ON `{database}`.* TO 'paw_test_role_user'@'{host}'",
            f"GRANT paw_test_role TO 'paw_test_role_user'@'{host}'",
            f"SET DEFAULT ROLE paw_test_role FOR 'paw_test_role_user'@'{host}'",
            f"GRANT SELECT ON `{database}`.* TO 'paw_test_nested_user'@'{host}'",
            f"GRANT paw_test_outer TO 'paw_test_nested_user'@'{host}'",
            f"SET DEFAULT ROLE paw_test_outer FOR 'paw_test_nested_user'@'{host}'",
            f"GRANT SELECT ON `{database}`.* TO 'paw_test_option_user'@'{host}' WITH GRANT OPTION",
        ]
    server = _connect(database=None)
    with contextlib.closing(server), server.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement)
    yield {name: {**mariadb, "user": name} for name in users}
    drop_users(*users)
    server = _connect(database=None)
    with contextlib.closing(server), server.cursor() as cursor:
        for role in ("paw_test_role", "paw_test_outer", "paw_test_inner"):
            cursor.execute(f"DROP ROLE IF EXISTS {role}")


@pytest.mark.django_db
def test_mariadb_privileges_through_roles_and_grant_options_are_refused(
    operator_client, maria_role_users
):
    expected = {
        "paw_test_role_user": {"FILE", "INSERT"},
        "paw_test_nested_user": {"FILE"},
        "paw_test_option_user": {"GRANT OPTION"},
    }
    for user, connection in maria_role_users.items():
        response = _create(operator_client, "maria", "mysql", connection)
        assert response.status_code == 400, (user, response.json())
        assert expected[user] <= set(response.json()["privileges"]), (user, response.json())
    assert not Datasource.objects.exists()


@pytest.fixture
def maria_wide_readers(mariadb):
    """MariaDB users that may only SELECT, but beyond their database: every database
    (``*.*``), the ``mysql`` database, its ``user`` table (password hashes). Dropped
    afterwards."""
    database = mariadb["database"]
    grants = {
        "paw_test_global_reader": ["SELECT ON *.*"],
        "paw_test_mysql_reader": [f"SELECT ON `{database}`.*", "SELECT ON `mysql`.*"],
        "paw_test_hash_reader": [f"SELECT ON `{database}`.*", "SELECT ON `mysql`.`user`"],
    }
    server = _connect(database=None)
    with contextlib.closing(server), server.cursor() as cursor:
        for user, privileges in grants.items():
            for host in USER_HOSTS:
                cursor.execute(f"CREATE USER IF NOT EXISTS '{user}'@'{host}'")
                for privilege in privileges:
                    cursor.execute(f"GRANT {privilege} TO '{user}'@'{host}'")
    yield {name: {**mariadb, "user": name} for name in grants}
    drop_users(*grants)


@pytest.mark.django_db
def test_mariadb_select_beyond_the_datasource_database_is_refused(
    operator_client, maria_wide_readers
):
    """The second pass: ``GRANT SELECT ON *.*`` (every database, ``mysql.user``'s password
    hashes with it) and SELECT on ``mysql`` were saved as "can only read"."""
    expected = {
        "paw_test_global_reader": ["SELECT on *.*"],
        "paw_test_mysql_reader": ["SELECT on mysql.*"],
        "paw_test_hash_reader": ["SELECT on mysql.user"],
    }
    for user, connection in maria_wide_readers.items():
        response = _create(operator_client, "maria", "mysql", connection)
        assert response.status_code == 400, (user, response.json())
        assert response.json()["code"] == "datasource_user_privileged"
        assert response.json()["privileges"] == expected[user], (user, response.json())
    assert not Datasource.objects.exists()


@pytest.fixture
def maria_default_role_reader(mariadb):
    """A MariaDB user that reads its database through a default role that only reads:
    ``SHOW GRANTS`` lists ``SET DEFAULT ROLE … FOR …`` among its grants. Dropped after."""
    database = mariadb["database"]
    server = _connect(database=None)
    with contextlib.closing(server), server.cursor() as cursor:
        cursor.execute("CREATE ROLE IF NOT EXISTS paw_test_read_role")
        cursor.execute(f"GRANT SELECT, SHOW VIEW ON `{database}`.* TO paw_test_read_role")
        for host in USER_HOSTS:
            cursor.execute(f"CREATE USER IF NOT EXISTS 'paw_test_default_role'@'{host}'")
            cursor.execute(f"GRANT paw_test_read_role TO 'paw_test_default_role'@'{host}'")
            cursor.execute(
                f"SET DEFAULT ROLE paw_test_read_role FOR 'paw_test_default_role'@'{host}'"
            )
    yield {**mariadb, "user": "paw_test_default_role"}
    drop_users("paw_test_default_role")
    server = _connect(database=None)
    with contextlib.closing(server), server.cursor() as cursor:
        cursor.execute("DROP ROLE IF EXISTS paw_test_read_role")


@pytest.mark.django_db
def test_a_mariadb_default_role_line_is_not_read_as_a_grant(
    operator_client, maria_default_role_reader
):
    """The second pass: ``SET DEFAULT ROLE`` lines of ``SHOW GRANTS`` were misread (as
    "an unreadable grant"), refusing a user that can only read."""
    response = _create(operator_client, "maria", "mysql", maria_default_role_reader)
    assert response.status_code == 201, response.json()
    assert response.json()["user_privileges"] == {"refused": [], "noted": []}


@pytest.fixture
def pg_powerful_readers():
    """PostgreSQL login roles that read (``pg_read_all_data``) and can do one more thing,
    made on the real server: EXECUTE on an administration function, directly or through a
    role; EXECUTE on a superuser's SECURITY DEFINER function; a role attribute, held or
    through a NOINHERIT membership. Yields ``{user: the privileges expected}``; the
    grants and the function are taken back afterwards."""
    server = pg_datasource_settings(reader=False)
    users = {
        "paw_test_reads_files": ["EXECUTE on pg_read_file"],
        "paw_test_imports": ["EXECUTE on lo_import"],
        "paw_test_definer_user": [
            "EXECUTE on public.paw_test_definer, a superuser's SECURITY DEFINER function"
        ],
        "paw_test_createdb": ["CREATEDB"],
        "paw_test_bypassrls": ["BYPASSRLS"],
        "paw_test_replication": ["REPLICATION"],
        "paw_test_creator_member": ["CREATEROLE through role paw_test_creator"],
    }
    attributes = {
        "paw_test_createdb": "CREATEDB",
        "paw_test_bypassrls": "BYPASSRLS",
        "paw_test_replication": "REPLICATION",
    }
    grants = [
        "GRANT EXECUTE ON FUNCTION pg_read_file(text) TO paw_test_reads_files",
        "GRANT EXECUTE ON FUNCTION lo_import(text) TO paw_test_lo_role",
        "GRANT paw_test_lo_role TO paw_test_imports",
        "GRANT EXECUTE ON FUNCTION public.paw_test_definer() TO paw_test_definer_user",
        "GRANT paw_test_creator TO paw_test_creator_member",
    ]
    with psycopg.connect(
        host=server["host"], port=server["port"], user=server["user"],
        dbname=server["database"], autocommit=True,
    ) as conn:  # fmt: skip
        for statement in (
            "CREATE ROLE paw_test_lo_role NOLOGIN",
            "CREATE ROLE paw_test_creator NOLOGIN CREATEROLE",
            "CREATE ROLE paw_test_creator_member LOGIN NOINHERIT",
            *(f"CREATE ROLE {user} LOGIN" for user in users if user not in attributes),
            *(f"CREATE ROLE {user} LOGIN {word}" for user, word in attributes.items()),
        ):
            with contextlib.suppress(
                psycopg.errors.DuplicateObject, psycopg.errors.UniqueViolation
            ):
                conn.execute(statement)
        for user in users:
            conn.execute(f"GRANT pg_read_all_data TO {user}")
        conn.execute(
            "CREATE OR REPLACE FUNCTION public.paw_test_definer() RETURNS text "
            "LANGUAGE sql SECURITY DEFINER AS 'SELECT current_user::text'"
        )
        conn.execute("REVOKE EXECUTE ON FUNCTION public.paw_test_definer() FROM PUBLIC")
        for statement in grants:
            conn.execute(statement)
        yield users
        conn.execute("REVOKE EXECUTE ON FUNCTION pg_read_file(text) FROM paw_test_reads_files")
        conn.execute("REVOKE EXECUTE ON FUNCTION lo_import(text) FROM paw_test_lo_role")
        conn.execute("DROP FUNCTION public.paw_test_definer()")


@pytest.mark.django_db
def test_postgresql_users_that_reach_the_server_through_functions_or_attributes_are_refused(
    operator_client, pg_powerful_readers
):
    """The second pass: EXECUTE on pg_read_file / lo_import (granted, or through a role),
    on a superuser's SECURITY DEFINER function, and CREATEROLE / CREATEDB / BYPASSRLS /
    REPLICATION (held, or through a NOINHERIT membership: SET ROLE gives it) were saved
    as "can only read" (the attributes only noted). Each is refused, saying which."""
    for user, expected in pg_powerful_readers.items():
        connection = {**pg_datasource_settings(), "user": user}
        response = _create(operator_client, "pg", "postgresql", connection)
        assert response.status_code == 400, (user, response.json())
        assert response.json()["code"] == "datasource_user_privileged"
        assert response.json()["privileges"] == expected, (user, response.json())
    assert not Datasource.objects.exists()
    # The reader of the other tests has none of these: it is still saved.
    assert _create(operator_client, "pg", "postgresql", pg_datasource_settings()).status_code == 201
