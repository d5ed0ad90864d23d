"""Teams: Django's groups under PAW's name. The staff's REST (``/api/admin/teams``), a
person's own teams on ``/api/auth/me``, the default team of new accounts, the admin's
team page with its members, and the one access rule (``teams.selectors.accessible``)."""

from __future__ import annotations

import json
import re

import pytest
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from accounts.models import User
from teams.models import Access, Team
from teams.selectors import accessible, may_use, user_team_ids
from tests.conftest import PASSWORD, api_client_for
from tests.paw_project.test_settings import _django

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("reset_throttles")]


@pytest.fixture
def staff_api(make_user):
    return api_client_for(make_user("operator", is_staff=True))


def test_staff_create_list_update_and_delete_a_team(staff_api, make_user):
    make_user("alice"), make_user("bob")
    made = staff_api.post(
        "/api/admin/teams", {"name": "analysts", "members": ["bob", "alice"]}, format="json"
    )
    assert made.status_code == 201, made.content
    team = made.json()
    assert team == {"id": team["id"], "name": "analysts", "members": ["alice", "bob"]}
    assert Group.objects.get(pk=team["id"]).user_set.count() == 2

    listed = staff_api.get("/api/admin/teams").json()
    assert listed == {"teams": [team]}
    assert staff_api.get(f"/api/admin/teams/{team['id']}").json() == team

    changed = staff_api.patch(
        f"/api/admin/teams/{team['id']}", {"name": "finance", "members": ["bob"]}, format="json"
    )
    assert changed.json() == {"id": team["id"], "name": "finance", "members": ["bob"]}
    renamed_only = staff_api.patch(f"/api/admin/teams/{team['id']}", {"name": "fin"}, format="json")
    assert renamed_only.json()["members"] == ["bob"]  # members left out: kept

    assert staff_api.delete(f"/api/admin/teams/{team['id']}").status_code == 204
    assert not Group.objects.exists()
    assert User.objects.filter(username="bob").exists()  # members keep their accounts
    gone = staff_api.get(f"/api/admin/teams/{team['id']}")
    assert (gone.status_code, gone.json()["code"]) == (404, "team_not_found")


def test_bad_team_input_is_refused_and_changes_nothing(staff_api, make_user):
    make_user("alice")
    unknown = staff_api.post(
        "/api/admin/teams", {"name": "analysts", "members": ["alice", "nobody"]}, format="json"
    )
    assert (unknown.status_code, unknown.json()["code"]) == (400, "unknown_user")
    assert "nobody" in unknown.json()["detail"]
    assert not Group.objects.exists()

    team = staff_api.post("/api/admin/teams", {"name": "Analysts"}, format="json").json()
    taken = staff_api.post("/api/admin/teams", {"name": "analysts"}, format="json")
    assert (taken.status_code, taken.json()["code"]) == (409, "team_name_taken")
    blank = staff_api.post("/api/admin/teams", {"name": "   "}, format="json")
    assert (blank.status_code, blank.json()["code"]) == (400, "blank")
    extra = staff_api.post("/api/admin/teams", {"name": "x", "budget": 5}, format="json")
    assert (extra.status_code, extra.json()["code"]) == (400, "unknown_field")
    wrong_type = staff_api.post(
        "/api/admin/teams", {"name": "x", "members": "alice"}, format="json"
    )
    assert wrong_type.status_code == 400

    other = staff_api.post("/api/admin/teams", {"name": "finance"}, format="json").json()
    clash = staff_api.patch(
        f"/api/admin/teams/{other['id']}", {"name": "ANALYSTS", "members": ["alice"]}, format="json"
    )
    assert (clash.status_code, clash.json()["code"]) == (409, "team_name_taken")
    assert Team.objects.get(pk=other["id"]).name == "finance"
    assert not Team.objects.get(pk=other["id"]).user_set.exists()  # nothing half-done
    assert Team.objects.get(pk=team["id"]).name == "Analysts"


def test_only_staff_manage_teams(api):
    for method, path in (
        ("get", "/api/admin/teams"),
        ("post", "/api/admin/teams"),
        ("get", "/api/admin/teams/1"),
        ("delete", "/api/admin/teams/1"),
    ):
        response = getattr(api, method)(path, {}, format="json")
        assert response.status_code == 403, (method, path)
    assert APIClient().get("/api/admin/teams").status_code == 401


def test_me_shows_a_persons_own_teams(api, user):
    assert api.get("/api/auth/me").json()["teams"] == []
    analysts, finance = Team.objects.create(name="analysts"), Team.objects.create(name="finance")
    Team.objects.create(name="ops")  # not theirs
    user.groups.add(finance, analysts)
    me = api.get("/api/auth/me").json()
    assert me["teams"] == [
        {"id": analysts.id, "name": "analysts"},
        {"id": finance.id, "name": "finance"},
    ]
    assert me["is_staff"] is False
    assert user_team_ids(user) == {analysts.id, finance.id}


def test_new_accounts_join_the_default_team(settings, registration_open):
    settings.PAW_DEFAULT_TEAM = "everyone-here"
    made = APIClient().post(
        "/api/auth/register", {"username": "newcomer", "password": PASSWORD}, format="json"
    )
    assert made.status_code == 201, made.content
    team = Team.objects.get(name="everyone-here")  # made on first use
    assert list(team.user_set.values_list("username", flat=True)) == ["newcomer"]
    settings.PAW_DEFAULT_TEAM = "EVERYONE-HERE"  # the same team, ignoring case
    APIClient().post(
        "/api/auth/register", {"username": "second", "password": PASSWORD}, format="json"
    )
    assert Team.objects.count() == 1 and team.user_set.count() == 2


def test_without_a_default_team_new_accounts_join_none(registration_open):
    APIClient().post(
        "/api/auth/register", {"username": "newcomer", "password": PASSWORD}, format="json"
    )
    assert not User.objects.get(username="newcomer").groups.exists()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, True),  # the embedded mode (no Redis): the demo lets people sign up
        ({"PAW_REDIS_URL": "redis://127.0.0.1:6379/0"}, False),  # a server: closed
        ({"PAW_REDIS_URL": "redis://127.0.0.1:6379/0", "PAW_ALLOW_REGISTRATION": "1"}, True),
        ({"PAW_ALLOW_REGISTRATION": "0"}, False),
    ],
)
def test_registration_is_open_by_default_only_in_the_embedded_mode(tmp_path, env, expected):
    code = (
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps(s.PAW_ALLOW_REGISTRATION))"
    )
    result = _django({"PAW_SECRET_KEY": "k" * 50, "PAW_VAR_DIR": str(tmp_path), **env}, code)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) is expected


def test_the_access_rule_everyone_teams_and_staff(make_user):
    from secrets_vault.models import Datasource

    alice, bob, carol = make_user("alice"), make_user("bob"), make_user("carol")
    staff = make_user("operator", is_staff=True)
    analysts, finance = Team.objects.create(name="analysts"), Team.objects.create(name="finance")
    alice.groups.add(analysts)
    bob.groups.add(analysts, finance)

    def datasource(slug: str, access: str, *teams: Team) -> Datasource:
        made = Datasource.objects.create(
            slug=slug, name=slug, dialect="sqlite", connection={"database": "/nonexistent"},
            access=access,
        )  # fmt: skip
        made.teams.set(teams)
        return made

    open_one = datasource("open", Access.EVERYONE)
    analysts_only = datasource("analysts-db", Access.TEAMS, analysts)
    both = datasource("shared-db", Access.TEAMS, analysts, finance)
    nobody = datasource("staff-db", Access.TEAMS)
    assert Datasource._meta.get_field("access").default == Access.TEAMS  # new: staff only

    def slugs(user) -> list[str]:
        return sorted(accessible(Datasource.objects.all(), user).values_list("slug", flat=True))

    assert slugs(alice) == ["analysts-db", "open", "shared-db"]
    assert slugs(bob) == ["analysts-db", "open", "shared-db"]  # each once, in two teams
    assert slugs(carol) == ["open"]
    assert slugs(staff) == ["analysts-db", "open", "shared-db", "staff-db"]
    assert slugs(None) == []
    assert may_use(analysts_only, alice) and not may_use(analysts_only, carol)
    assert may_use(nobody, staff) and not may_use(nobody, bob)
    assert may_use(open_one, carol) and may_use(both, bob)
    # A team taken away takes the access with it.
    alice.groups.remove(analysts)
    assert slugs(alice) == ["open"]


def inline_management_forms(html: str) -> dict[str, str]:
    """The management form fields (``<prefix>-TOTAL_FORMS`` …) of the inlines other apps
    show on a team's page (``teams.admin.TEAM_INLINES``), as the page has them: a post
    without them is refused by Django's formsets."""
    management = r'<input type="hidden" name="([\w-]+-(?:TOTAL|INITIAL|MIN_NUM|MAX_NUM)_FORMS)"'
    return dict(re.findall(management + r'[^>]*?value="(\d*)"', html))


def test_the_admin_shows_a_teams_members_and_saves_them(client, make_user):
    make_user("operator", is_staff=True, is_superuser=True)
    alice, bob = make_user("alice"), make_user("bob")
    client.login(username="operator", password=PASSWORD)
    page = client.get("/admin/teams/team/add/")
    assert page.status_code == 200
    assert b'name="members"' in page.content
    inlines = inline_management_forms(page.content.decode())
    saved = client.post(
        "/admin/teams/team/add/", {"name": "analysts", "members": [alice.pk, bob.pk], **inlines}
    )
    assert saved.status_code == 302, saved.content[:2000]
    team = Team.objects.get(name="analysts")
    assert set(team.user_set.all()) == {alice, bob}
    listing = client.get("/admin/teams/team/")
    assert b"analysts" in listing.content
    inlines = inline_management_forms(
        client.get(f"/admin/teams/team/{team.pk}/change/").content.decode()
    )
    changed = client.post(
        f"/admin/teams/team/{team.pk}/change/",
        {"name": "analysts", "members": [bob.pk], **inlines},
    )
    assert changed.status_code == 302
    assert list(team.user_set.all()) == [bob]
    assert client.get("/admin/auth/group/").status_code == 404  # one place for teams


NFD_EQUIPE = "E\u0301quipe"  # "Équipe", decomposed


@pytest.mark.parametrize(
    ("first", "second"),
    [("Ops", "OPS"), ("Équipe", "équipe"), ("Équipe", NFD_EQUIPE), ("Straße", "STRASSE")],
)
def test_team_names_clash_ignoring_case_beyond_ascii_and_normalization(staff_api, first, second):
    made = staff_api.post("/api/admin/teams", {"name": first}, format="json")
    assert made.status_code == 201, made.content
    taken = staff_api.post("/api/admin/teams", {"name": second}, format="json")
    assert (taken.status_code, taken.json()["code"]) == (409, "team_name_taken")
    assert Team.objects.count() == 1


def test_a_team_name_is_stored_nfc_and_invisible_characters_are_refused(staff_api):
    made = staff_api.post("/api/admin/teams", {"name": f"  {NFD_EQUIPE} "}, format="json")
    assert made.json()["name"] == "Équipe"
    for name in ("Ops\u200b", "O\u200dps", "\ufeffOps", "Op\u0007s", "Op\u202es"):
        refused = staff_api.post("/api/admin/teams", {"name": name}, format="json")
        assert (refused.status_code, refused.json()["code"]) == (400, "team_name_invalid"), name
    assert list(Team.objects.values_list("name", flat=True)) == ["Équipe"]


def test_the_database_refuses_a_second_team_of_a_name_whatever_the_path(staff_api, monkeypatch):
    from django.db import IntegrityError, transaction

    from teams import services

    staff_api.post("/api/admin/teams", {"name": "Race"}, format="json")
    with pytest.raises(IntegrityError), transaction.atomic():
        Group.objects.create(name="RACE")  # no service, no check: the key's unique index
    # two concurrent creates: both passed the check before either saved
    monkeypatch.setattr(services, "team_name_clash", lambda name, exclude_pk=None: False)
    raced = staff_api.post("/api/admin/teams", {"name": "race"}, format="json")
    assert (raced.status_code, raced.json()["code"]) == (409, "team_name_taken")
    assert list(Team.objects.values_list("name", flat=True)) == ["Race"]


def test_a_rename_keeps_the_name_key_in_step(staff_api):
    team = staff_api.post("/api/admin/teams", {"name": "Ops"}, format="json").json()
    staff_api.patch(f"/api/admin/teams/{team['id']}", {"name": "Platform"}, format="json")
    assert staff_api.post("/api/admin/teams", {"name": "OPS"}, format="json").status_code == 201
    taken = staff_api.post("/api/admin/teams", {"name": "PLATFORM"}, format="json")
    assert taken.status_code == 409
    same = staff_api.patch(f"/api/admin/teams/{team['id']}", {"name": "platform"}, format="json")
    assert same.json()["name"] == "platform"  # its own name in another case: no clash


def test_the_admin_refuses_a_team_name_another_has_ignoring_case(client, make_user):
    make_user("operator", is_staff=True, is_superuser=True)
    client.login(username="operator", password=PASSWORD)
    ops = Team.objects.create(name="Ops")
    for name, code in (("OPS", "exists"), ("équipe\u200b", "invisible")):
        page = client.get("/admin/teams/team/add/")
        inlines = inline_management_forms(page.content.decode())
        refused = client.post("/admin/teams/team/add/", {"name": name, **inlines})
        assert refused.status_code == 200  # the form again, with its error
        assert code in refused.context["adminform"].form.errors["name"][0]
    other = Team.objects.create(name="Finance")
    inlines = inline_management_forms(
        client.get(f"/admin/teams/team/{other.pk}/change/").content.decode()
    )
    renamed = client.post(f"/admin/teams/team/{other.pk}/change/", {"name": "ops", **inlines})
    assert renamed.status_code == 200 and "exists" in str(renamed.context["adminform"].form.errors)
    assert sorted(Team.objects.values_list("name", flat=True)) == ["Finance", "Ops"]
    assert ops.name_key.key == "ops"


def test_the_default_team_and_the_claim_find_the_one_team_of_the_name(settings, make_user):
    from teams.services import user_join_default_team, user_teams_from_claim

    equipe = Team.objects.create(name="Équipe")
    settings.PAW_DEFAULT_TEAM = "ÉQUIPE"
    alice = make_user("alice")
    user_join_default_team(user=alice)
    assert list(alice.groups.all()) == [equipe]
    names = user_teams_from_claim(
        user=alice, names=[NFD_EQUIPE.lower(), "équipe\u200b"], create=True
    )
    assert names == ["Équipe"] and Team.objects.count() == 1


def test_the_migration_keys_existing_teams_and_renames_a_clash():
    import importlib

    from django.apps import apps

    from teams.models import TeamName

    migration = importlib.import_module("teams.migrations.0002_team_name_unique_key")
    ops, clash, other = Group.objects.bulk_create(
        [Group(name="Ops"), Group(name="OPS"), Group(name="Équipe")]
    )  # no signal: as before the key existed
    TeamName.objects.all().delete()
    migration.team_name_keys_make(apps, None)
    clash.refresh_from_db()
    assert clash.name == f"OPS ({clash.pk})"
    keys = dict(TeamName.objects.values_list("team_id", "key"))
    assert keys == {ops.pk: "ops", clash.pk: f"ops ({clash.pk})", other.pk: "équipe"}
