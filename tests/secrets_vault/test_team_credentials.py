"""Per-team credentials on a datasource (issue 27, part 2): a team's own database user and
password, which its members' runs connect as (the highest priority of a person's teams),
while the schema harvest and the example checks use the datasource's own; checked as the
datasource's user is (a placeholder password only, a user that can only read); managed in
the admin and over ``/api/admin/datasources/{slug}/credentials``. The end-to-end test: two
PostgreSQL roles under row-level security, two teams, each team's run gets only its rows
and both are shown the same schema."""

from __future__ import annotations

import contextlib
import json
import re
from urllib.parse import urlsplit

import psycopg
import pytest
from django.contrib.admin.models import DELETION, LogEntry

from conversations.models import Run
from secrets_vault.models import DatasourceCredential
from secrets_vault.selectors import datasource_credential_for
from secrets_vault.services import (
    knowledge_for_run,
    sandbox_environment,
    secret_set,
)
from secrets_vault.services.knowledge import datasource_schema_refresh
from teams.models import Access, Team
from tests.conftest import PASSWORD, SCRIPTED_API_KEY, api_client_for
from tests.factories import datasource_made
from tests.live import wait_for
from tests.pgdatasource import pg_datasource_connect, pg_datasource_settings
from tests.secrets_vault.conftest import secret_value

#: The PostgreSQL roles of the two teams (cluster-wide, kept between sessions like
#: ``tests.pgdatasource.READER``): login roles that may read one table and nothing more.
ROLES = {"north": "paw_test_team_north", "south": "paw_test_team_south"}
TABLE = "paw_rls_sales"
CREDENTIALS = "/api/admin/datasources/{slug}/credentials"


@pytest.fixture
def rls_table():
    """``paw_rls_sales (region, amount)`` in the datasource test database, two rows per
    team role, under row-level security: each role sees the rows whose ``region`` is its
    own name; the datasource's own user (``paw_test_reader``) has no policy, so sees none.
    Dropped afterwards."""
    with pg_datasource_connect() as conn:
        for role in ROLES.values():
            with contextlib.suppress(psycopg.errors.DuplicateObject):
                conn.execute(f"CREATE ROLE {role} LOGIN")
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(f"CREATE TABLE {TABLE} (id int PRIMARY KEY, region text, amount int)")
        conn.execute(f"COMMENT ON TABLE {TABLE} IS 'Sales; each team sees its own region'")
        conn.execute(
            f"INSERT INTO {TABLE} VALUES (1, %s, 10), (2, %s, 20), (3, %s, 300), (4, %s, 400)",  # noqa: S608 - a test table's name
            [ROLES["north"], ROLES["north"], ROLES["south"], ROLES["south"]],
        )
        conn.execute(f"ALTER TABLE {TABLE} ENABLE ROW LEVEL SECURITY")
        conn.execute(
            f"CREATE POLICY own_region ON {TABLE} FOR SELECT USING (region = current_user)"
        )
        for role in ROLES.values():
            conn.execute(f"GRANT SELECT ON {TABLE} TO {role}")
    yield
    with pg_datasource_connect() as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")


@pytest.fixture
def teams(make_user):
    """Teams *north* and *south* with one member each (ann, ben), cat in both, dan in
    neither; an operator."""
    north, south = Team.objects.create(name="north"), Team.objects.create(name="south")
    people = {name: make_user(name) for name in ("ann", "ben", "cat", "dan")}
    north.user_set.add(people["ann"], people["cat"])
    south.user_set.add(people["ben"], people["cat"])
    people["operator"] = make_user("operator", is_staff=True, is_superuser=True)
    return {"north": north, "south": south, **people}


def sales_datasource(**fields):
    """The PostgreSQL datasource on the test database, as its read-only user, open to
    everyone (the teams decide only which user a run connects as)."""
    return datasource_made(
        slug="sales", name="Sales", dialect="postgresql", connection=pg_datasource_settings(),
        **fields,
    )  # fmt: skip


def url_user(environment, datasource) -> str:
    return urlsplit(environment.env[datasource.env_name]).username


@pytest.mark.django_db
def test_a_run_connects_as_its_teams_user_the_highest_priority_one_when_several(teams):
    datasource = sales_datasource()
    north = DatasourceCredential.objects.create(
        datasource=datasource, team=teams["north"], db_user=ROLES["north"], priority=1
    )
    DatasourceCredential.objects.create(
        datasource=datasource, team=teams["south"], db_user=ROLES["south"], priority=5
    )
    assert datasource_credential_for(datasource=datasource, user=teams["ann"]) == north
    users = {
        name: url_user(
            sandbox_environment(user=teams[name], datasource_slugs=["sales"]), datasource
        )
        for name in ("ann", "ben", "cat", "dan", "operator")
    }
    assert users == {
        "ann": ROLES["north"], "ben": ROLES["south"],
        "cat": ROLES["south"],  # in both: south's priority is higher
        "dan": "paw_test_reader", "operator": "paw_test_reader",  # no team: the datasource's own
    }  # fmt: skip
    DatasourceCredential.objects.filter(team=teams["north"]).update(priority=9)
    cat = sandbox_environment(user=teams["cat"], datasource_slugs=["sales"])
    assert url_user(cat, datasource) == ROLES["north"]


@pytest.mark.django_db
def test_a_teams_password_is_a_placeholder_resolved_and_masked_like_the_datasources(teams):
    datasource = sales_datasource()
    value = secret_value("north-pw")
    secret_set(name="NORTH_PG_PASSWORD", value=value)
    DatasourceCredential.objects.create(
        datasource=datasource, team=teams["north"], db_user=ROLES["north"],
        password="{secret:NORTH_PG_PASSWORD}",
    )  # fmt: skip
    given = sandbox_environment(user=teams["ann"], datasource_slugs=["sales"])
    url = urlsplit(given.env[datasource.env_name])
    assert (url.username, url.password) == (ROLES["north"], value)
    assert given.secret_values["NORTH_PG_PASSWORD"] == value  # masked wherever it shows
    # Everyone else keeps the datasource's own user, without that password.
    dan = urlsplit(sandbox_environment(user=teams["dan"], datasource_slugs=["sales"]).env[
        datasource.env_name
    ])  # fmt: skip
    assert (dan.username, dan.password) == ("paw_test_reader", None)


@pytest.mark.django_db
def test_operators_manage_team_credentials_over_rest(teams, rls_table):
    staff = api_client_for(teams["operator"])
    datasource = sales_datasource()
    url = CREDENTIALS.format(slug="sales")
    assert staff.get(url).json() == {"credentials": []}
    made = staff.post(
        url, {"team": teams["north"].pk, "user": ROLES["north"], "priority": 3}, format="json"
    )
    assert made.status_code == 201, made.json()
    body = made.json()
    assert body["team"] == {"id": teams["north"].pk, "name": "north"}
    assert (body["user"], body["password"], body["priority"]) == (ROLES["north"], "", 3)
    assert body["user_privileges"] == {"refused": [], "noted": []}  # checked: it only reads
    assert body["privileges_checked_at"] is not None
    detail = staff.get("/api/admin/datasources/sales").json()
    assert [c["user"] for c in detail["credentials"]] == [ROLES["north"]]
    logged = LogEntry.objects.filter(object_id=str(body["id"])).values_list(
        "change_message", flat=True
    )
    assert [m for m in logged if "(POST /api/admin/datasources/sales/credentials)" in m]
    tested = staff.post("/api/admin/datasources/sales/test").json()
    assert tested["ok"] is True, tested
    assert f"Team north ({ROLES['north']}): " in tested["message"]

    def refused(payload: dict, status: int = 400) -> dict:
        response = staff.post(url, payload, format="json")
        assert response.status_code == status, response.json()
        assert {"detail", "code"} <= set(response.json())
        return response.json()

    south = teams["south"].pk
    literal = refused({"team": south, "user": ROLES["south"], "password": "hunter2-plain"})
    assert "literal password" in literal["detail"] and "hunter2-plain" not in json.dumps(literal)
    assert refused({"team": 999_999, "user": "x"})["code"] == "unknown_team"
    assert refused({"team": teams["north"].pk, "user": "other"}, 409)["code"] == (
        "credential_exists"
    )
    superuser = refused({"team": south, "user": pg_datasource_settings(reader=False)["user"]})
    assert (
        superuser["code"] == "datasource_user_privileged" and "superuser" in superuser["privileges"]
    )
    assert refused({"team": south})["code"] == "required"  # no user
    assert DatasourceCredential.objects.count() == 1

    one = f"{url}/{body['id']}"
    changed = staff.patch(one, {"priority": 7, "password": "{secret:NORTH_PW}"}, format="json")
    assert changed.status_code == 200 and changed.json()["priority"] == 7
    assert changed.json()["password"] == "{secret:NORTH_PW}"
    assert staff.patch(one, {"password": "plain-again"}, format="json").status_code == 400
    assert staff.get(one).json()["password"] == "{secret:NORTH_PW}"
    assert api_client_for(teams["ann"]).get(url).status_code == 403
    assert staff.delete(one).status_code == 204
    assert LogEntry.objects.filter(object_id=str(body["id"]), action_flag=DELETION).exists()
    assert staff.get(one).status_code == 404 and staff.get(one).json()["code"] == (
        "credential_not_found"
    )
    sqlite = datasource_made(
        slug="file", name="File", dialect="sqlite", connection={"database": "/srv/x.sqlite3"}
    )
    on_sqlite = staff.post(
        CREDENTIALS.format(slug=sqlite.slug), {"team": south, "user": "x"}, format="json"
    )
    assert on_sqlite.status_code == 400 and on_sqlite.json()["code"] == "credentials_not_supported"
    assert datasource.credentials.count() == 0


@pytest.mark.django_db
def test_the_admin_adds_a_teams_credentials_inline_and_refuses_a_privileged_user(
    teams, rls_table, client
):
    from tests.teams.test_teams import inline_management_forms

    datasource = sales_datasource()
    client.login(username="operator", password=PASSWORD)
    url = f"/admin/secrets_vault/datasource/{datasource.pk}/change/"
    page = client.get(url).content.decode()
    form = {
        "slug": "sales", "name": "Sales", "description": "", "dialect": "postgresql",
        "connection": json.dumps(datasource.connection), "read_only": "on", "enabled": "on",
        "access": "everyone", "allowed_hosts": "[]", **inline_management_forms(page),
        "credentials-TOTAL_FORMS": "1", "credentials-0-team": str(teams["north"].pk),
        "credentials-0-db_user": pg_datasource_settings(reader=False)["user"],
        "credentials-0-password": "", "credentials-0-priority": "0",
    }  # fmt: skip
    privileged = client.post(url, form)
    assert privileged.status_code == 200 and "superuser" in privileged.content.decode()
    assert not DatasourceCredential.objects.exists()
    saved = client.post(url, {**form, "credentials-0-db_user": ROLES["north"]})
    assert saved.status_code == 302, saved.content.decode()[:3000]
    credential = DatasourceCredential.objects.get()
    assert credential.db_user == ROLES["north"] and credential.privileges_checked_at
    team_page = client.get(f"/admin/teams/team/{teams['north'].pk}/change/").content.decode()
    assert ROLES["north"] in team_page


def ask(api, scripted_model, question: str) -> dict:
    """``POST /api/sql/ask`` on ``sales``, the scripted model answering ``question`` with
    one ``run_sql`` of every row of the table; the finished run."""
    started = api.post("/api/sql/ask", {"datasource": "sales", "question": question}, format="json")
    assert started.status_code == 202, started.json()
    url = f"/api/conversations/{started.json()['conversation_id']}/runs/{started.json()['id']}"
    return wait_for(
        lambda: (run := api.get(url).json())["status"] in ("done", "error", "cancelled") and run,
        timeout=90,
        what="the run to end",
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_row_level_security_gives_each_team_its_rows_and_both_the_same_schema(
    teams, rls_table, celery_worker, scripted_model
):
    staff = api_client_for(teams["operator"])
    datasource = sales_datasource(access=Access.TEAMS, teams=[teams["north"].pk, teams["south"].pk])
    secret_set(name="NORTH_PG_PASSWORD", value=secret_value("north-pw"))  # trusted: any works
    for team, password in (("north", "{secret:NORTH_PG_PASSWORD}"), ("south", "")):
        made = staff.post(
            CREDENTIALS.format(slug="sales"),
            {"team": teams[team].pk, "user": ROLES[team], "password": password},
            format="json",
        )
        assert made.status_code == 201, made.json()
    # The harvest connects as the datasource's own user, whichever team asks.
    datasource_schema_refresh(datasource_id=datasource.pk, user=teams["operator"])
    query = f"SELECT region, amount FROM {TABLE} ORDER BY amount"  # noqa: S608 - a constant
    questions = {"ann": "North sales?", "ben": "South sales?"}
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Sales",
            "rules": [
                {"match": re.escape(question), "responses": [
                    {"tool_calls": [{"name": "run_sql",
                                     "arguments": {"datasource": "sales", "query": query}}]},
                    {"text": "{{tool_result}}"},
                ]}
                for question in questions.values()
            ],
        }
    )  # fmt: skip
    results = {}
    for name, question in questions.items():
        run = ask(api_client_for(teams[name]), scripted_model, question)
        assert run["status"] == "done", (run["errors"], celery_worker.output()[-4000:])
        results[name] = run["result"]["rows"]
    assert results == {
        "ann": [[ROLES["north"], 10], [ROLES["north"], 20]],
        "ben": [[ROLES["south"], 300], [ROLES["south"], 400]],
    }
    assert Run.objects.filter(kind="sql", status="done").count() == 2
    # dan is in neither team: the datasource is not his to ask.
    refused = api_client_for(teams["dan"]).post(
        "/api/sql/ask", {"datasource": "sales", "question": "All sales?"}, format="json"
    )
    assert refused.status_code == 400 and refused.json()["code"] == "unknown_datasource"

    def schema(name: str) -> list[dict]:
        given = knowledge_for_run(datasource_slugs=["sales"], prompt="sales", user=teams[name])
        return [e for e in given.entries if e["kind"] == "schema"]

    north, south = schema("ann"), schema("ben")
    assert north == south
    [sales] = [e for e in north if e["title"] == TABLE]
    assert "each team sees its own region" in sales["text"] and "amount integer" in sales["text"]
