"""Who may use which datasource (issue 27, part 2), path by path: the datasource listing
and detail (404, as an unknown one), a run's and a conversation's ``datasources``,
``POST /api/sql/ask`` (400 naming it), a conversation's kept datasources after a team
change (left out of the run, with a notice), what the worker hands a sandbox and its
knowledge, the index files a sandbox keeps, exports (what was shown stays), and the
operators' ``PATCH /api/admin/datasources/{slug}`` of ``access`` and ``teams``. One rule
behind them all: ``secrets_vault.selectors.datasources_for_user``."""

from __future__ import annotations

import json
import sqlite3

import pytest

from conversations.models import Run, RunEvent
from paw_project.errors import InvalidRequest
from sandboxes.host_folder import KNOWLEDGE_FOLDER, knowledge_indexes_place
from secrets_vault.models import Datasource, KnowledgeEntry
from secrets_vault.selectors import datasources_for_user
from secrets_vault.services import knowledge_for_run, sandbox_environment
from secrets_vault.services.knowledge import datasource_schema_refresh
from teams.models import Access, Team
from tests.conftest import SCRIPTED_API_KEY, api_client_for
from tests.factories import conversation_of, datasource_made

pytestmark = pytest.mark.django_db


@pytest.fixture
def shop_file(tmp_path):
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, day TEXT, total REAL)")
        db.execute("INSERT INTO orders (day, total) VALUES ('Sun', 43.25)")
    return path


@pytest.fixture
def world(make_user, shop_file, settings, scripted_model):
    """alice (in no team), bob (in *analysts*), an operator; datasources ``open``
    (everyone), ``finance`` (analysts only) and ``vault`` (teams, none: staff only), each
    a real SQLite file with its schema harvested. Runs validate against the scripted
    model."""
    settings.PAW_LLM_BASE_URL = scripted_model.base_url
    settings.PAW_LLM_API_KEY = SCRIPTED_API_KEY
    settings.PAW_LLM_MODEL = "scripted-model"
    people = {
        "alice": make_user("alice"),
        "bob": make_user("bob"),
        "operator": make_user("operator", is_staff=True, is_superuser=True),
    }
    analysts = Team.objects.create(name="analysts")
    analysts.user_set.add(people["bob"])
    connection = {"database": str(shop_file)}
    made = {
        "open": datasource_made(slug="open", name="Open", dialect="sqlite", connection=connection),
        "finance": datasource_made(
            slug="finance", name="Finance", dialect="sqlite", connection=connection,
            access=Access.TEAMS, teams=[analysts.pk],
        ),
        "vault": datasource_made(
            slug="vault", name="Vault", dialect="sqlite", connection=connection,
            access=Access.TEAMS,
        ),
    }  # fmt: skip
    for datasource in made.values():
        datasource_schema_refresh(datasource_id=datasource.pk, user=None)
    return {"team": analysts, "datasources": made, **people}


def slugs(response) -> list[str]:
    return [d["slug"] for d in response.json()["datasources"]]


def test_the_listing_shows_each_person_only_what_they_may_use(world):
    assert slugs(api_client_for(world["alice"]).get("/api/datasources")) == ["open"]
    assert slugs(api_client_for(world["bob"]).get("/api/datasources")) == ["finance", "open"]
    staff = api_client_for(world["operator"]).get("/api/datasources")
    assert slugs(staff) == ["finance", "open", "vault"]
    assert [d.slug for d in datasources_for_user(None)] == []  # nobody signed in: none


def test_a_datasource_one_may_not_use_is_a_404_like_an_unknown_one(world):
    alice = api_client_for(world["alice"])
    refused, unknown = alice.get("/api/datasources/finance"), alice.get("/api/datasources/nope")
    assert refused.status_code == unknown.status_code == 404
    assert refused.json() == {"detail": "No datasource 'finance'.", "code": "datasource_not_found"}
    assert unknown.json()["code"] == refused.json()["code"]
    shown = api_client_for(world["bob"]).get("/api/datasources/finance")
    assert shown.status_code == 200
    assert [t["name"] for t in shown.json()["schema"]["tables"]] == ["orders"]
    assert api_client_for(world["bob"]).get("/api/datasources/vault").status_code == 404
    assert api_client_for(world["operator"]).get("/api/datasources/vault").status_code == 200


def test_a_run_conversation_or_question_naming_one_is_refused_naming_it(world):
    alice = api_client_for(world["alice"])
    conversation = conversation_of(world["alice"])
    url = f"/api/conversations/{conversation.id}"
    for response in (
        alice.post(f"{url}/runs", {"prompt": "hi", "datasources": ["open", "finance"]}, format="json"),
        alice.patch(url, {"datasources": ["finance"]}, format="json"),
        alice.post("/api/conversations", {"datasources": ["finance"]}, format="json"),
        alice.post("/api/sql/ask", {"datasource": "finance", "question": "Totals?"}, format="json"),
    ):  # fmt: skip
        assert response.status_code == 400, response.json()
        body = response.json()
        assert body["code"] == "unknown_datasource" and "finance" in body["detail"]
        assert body["slugs"] == ["finance"]
    assert not Run.objects.exists()
    conversation.refresh_from_db()
    assert conversation.datasources == []
    # The same for a slug the person may use but that is staff only for everyone else.
    bob = api_client_for(world["bob"])
    vault = bob.post("/api/sql/ask", {"datasource": "vault", "question": "?"}, format="json")
    assert vault.status_code == 400 and vault.json()["slugs"] == ["vault"]
    asked = bob.post("/api/sql/ask", {"datasource": "finance", "question": "?"}, format="json")
    assert asked.status_code == 202, asked.json()
    assert Run.objects.get(id=asked.json()["id"]).datasources == ["finance"]


def test_kept_datasources_one_lost_access_to_are_left_out_with_a_notice(world):
    bob = api_client_for(world["bob"])
    conversation = conversation_of(world["bob"])
    url = f"/api/conversations/{conversation.id}"
    kept = bob.patch(url, {"datasources": ["finance", "open"]}, format="json")
    assert kept.status_code == 200 and kept.json()["datasources"] == ["finance", "open"]

    def start() -> Run:
        response = bob.post(f"{url}/runs", {"prompt": "totals?"}, format="json")
        assert response.status_code == 202, response.json()
        run = Run.objects.get(id=response.json()["id"])
        Run.objects.filter(id=run.id).update(status="done")  # the next one may start
        return run

    first = start()
    assert first.datasources == ["finance", "open"]
    assert not RunEvent.objects.filter(run=first, type="notice").exists()
    world["team"].user_set.remove(world["bob"])  # bob leaves analysts
    second = start()
    assert second.datasources == ["open"]
    [notice] = RunEvent.objects.filter(run=second, type="notice")
    assert notice.kind == "datasource_access_lost"
    assert notice.payload["code"] == "datasource_access_lost"
    assert "finance" in notice.payload["message"] and "open" not in notice.payload["message"]
    events = bob.get(f"{url}/events?after=0").json()["events"]
    assert [e["event"]["code"] for e in events if e["type"] == "notice"] == [
        "datasource_access_lost"
    ]
    # The conversation keeps its choice: with access back, the datasource is back.
    conversation.refresh_from_db()
    assert conversation.datasources == ["finance", "open"]
    world["team"].user_set.add(world["bob"])
    third = start()
    assert third.datasources == ["finance", "open"]
    assert not RunEvent.objects.filter(run=third, type="notice").exists()
    # A datasource disabled since is left out quietly, as before.
    Datasource.objects.filter(slug="finance").update(enabled=False)
    assert start().datasources == ["open"]
    assert RunEvent.objects.filter(type="notice").count() == 1


def test_the_worker_checks_again_what_a_sandbox_and_its_knowledge_are_given(world):
    """A run queued before its person lost access is refused on the worker (the run
    ends ``unknown_datasource``), and its knowledge holds only what its person may use."""
    with pytest.raises(InvalidRequest) as refused:
        sandbox_environment(user=world["alice"], datasource_slugs=["open", "finance"])
    assert refused.value.code == "unknown_datasource" and refused.value.extra["slugs"] == [
        "finance"
    ]
    given = sandbox_environment(user=world["bob"], datasource_slugs=["open", "finance"])
    assert [d.slug for d in given.datasources] == ["open", "finance"]

    alice = knowledge_for_run(
        datasource_slugs=["open", "finance", "vault"], prompt="orders per day", user=world["alice"]
    )
    assert {e["datasource"] for e in alice.entries} == {"open"}
    assert [s.slug for s in alice.sources] == ["open"]
    bob = knowledge_for_run(
        datasource_slugs=["open", "finance", "vault"], prompt="orders per day", user=world["bob"]
    )
    assert {e["datasource"] for e in bob.entries} == {"open", "finance"}
    assert [s.slug for s in bob.sources] == ["finance", "open"]


def test_a_sandbox_keeps_the_index_files_of_its_runs_datasources_only(world, tmp_path):
    """The index ``search_knowledge`` reads is in the sandbox's ``.paw/host``: a later
    run without a datasource (its person lost it) finds no file of it left there."""
    workspace = tmp_path / "workspace"
    (workspace / KNOWLEDGE_FOLDER).mkdir(parents=True)
    folder = workspace / KNOWLEDGE_FOLDER
    both = knowledge_for_run(
        datasource_slugs=["open", "finance"], prompt="orders", user=world["bob"]
    )
    indexes = knowledge_indexes_place(workspace, both)
    assert [i["datasource"] for i in indexes] == ["finance", "open"]
    assert sorted(p.name.split(".")[0] for p in folder.iterdir()) == ["finance", "open"]
    world["team"].user_set.remove(world["bob"])
    less = knowledge_for_run(
        datasource_slugs=["open", "finance"], prompt="orders", user=world["bob"]
    )
    assert [i["datasource"] for i in knowledge_indexes_place(workspace, less)] == ["open"]
    assert [p.name.split(".")[0] for p in folder.iterdir()] == ["open"]
    none = knowledge_for_run(datasource_slugs=[], prompt="orders", user=world["bob"])
    assert knowledge_indexes_place(workspace, none) == []
    assert list(folder.iterdir()) == []


def test_an_export_keeps_the_rows_shown_and_fetches_nothing(world, tmp_path):
    """A conversation whose person lost the datasource exports as it was: the stored
    rows stay; the datasource is not read (here its file is gone altogether)."""
    conversation = conversation_of(world["bob"], title="Totals", datasources=["finance"])
    run = Run.objects.create(
        conversation=conversation, user=world["bob"], prompt="Totals?", status="done",
        datasources=["finance"],
    )  # fmt: skip
    rid = str(run.id)
    table = "| day | total |\n| --- | --- |\n| Sun | 43.25 |"
    query = "SELECT day, total FROM orders"
    lines = [
        {"type": "start", "prompt": "Totals?", "run_id": rid},
        {"type": "notify", "kind": "tool_calls", "run_id": rid, "data": [
            {"name": "run_sql", "args": {"datasource": "'finance'"},
             "input": {"datasource": "finance", "query": query}}
        ]},
        {"type": "notify", "kind": "tool", "run_id": rid, "data": {
            "name": "run_sql", "ok": True, "summary": "1 row",
            "output": {"stdout": table, "stderr": "", "error": None},
            "sql_result": {"datasource": "finance", "sql": query, "columns": ["day", "total"],
                           "rows": [["Sun", 43.25]], "row_count": 1, "truncated": False},
        }},
        {"type": "result", "answer": "Sunday: 43.25.", "errors": [], "error_messages": [],
         "cancelled": False, "run_id": rid},
    ]  # fmt: skip
    for cursor, line in enumerate(lines, start=1):
        RunEvent.objects.create(
            conversation=conversation, run=run, cursor=cursor, type=line["type"],
            kind=line.get("kind", ""), payload=line,
        )  # fmt: skip
    world["team"].user_set.remove(world["bob"])
    (tmp_path / "shop.sqlite3").unlink()  # nothing could be fetched anew
    bob = api_client_for(world["bob"])
    markdown = bob.get(f"/api/conversations/{conversation.id}/export?format=md")
    assert markdown.status_code == 200
    text = b"".join(markdown.streaming_content).decode()
    assert "| Sun | 43.25 |" in text and query in text
    exported = bob.get(f"/api/conversations/{conversation.id}/export?format=json")
    body = json.loads(b"".join(exported.streaming_content))
    assert body["conversation"]["datasources"] == ["finance"]
    [tool] = [e for e in body["events"] if e["kind"] == "tool"]
    assert tool["event"]["data"]["sql_result"]["rows"] == [["Sun", 43.25]]


def test_operators_set_access_and_teams_over_rest(world):
    staff = api_client_for(world["operator"])
    url = "/api/admin/datasources/vault"
    shown = staff.get(url).json()
    assert shown["access"] == "teams" and shown["teams"] == [] and shown["credentials"] == []
    team = world["team"]
    changed = staff.patch(url, {"teams": [team.pk, team.pk]}, format="json")
    assert changed.status_code == 200, changed.json()
    assert changed.json()["teams"] == [{"id": team.pk, "name": "analysts"}]
    assert slugs(api_client_for(world["bob"]).get("/api/datasources")) == [
        "finance", "open", "vault",
    ]  # fmt: skip
    unknown = staff.patch(url, {"teams": [team.pk, 999_999], "access": "everyone"}, format="json")
    assert unknown.status_code == 400
    assert unknown.json()["code"] == "unknown_team" and "999999" in unknown.json()["detail"]
    assert staff.get(url).json()["access"] == "teams"  # nothing changed
    before = staff.get(url).json()
    misspelt = staff.patch(url, {"acess": "everyone", "name": "Renamed"}, format="json")
    assert (misspelt.status_code, misspelt.json()["code"]) == (400, "unknown_field")
    assert staff.get(url).json() == before  # a misspelt rule changes nothing, not even the name
    bad = staff.patch(url, {"access": "anyone"}, format="json")
    assert bad.status_code == 400 and {"detail", "code"} <= set(bad.json())
    opened = staff.patch(url, {"access": "everyone", "teams": []}, format="json")
    assert opened.json()["access"] == "everyone" and opened.json()["teams"] == []
    assert "vault" in slugs(api_client_for(world["alice"]).get("/api/datasources"))
    listed = {d["slug"]: d for d in staff.get("/api/admin/datasources").json()["datasources"]}
    assert listed["finance"]["access"] == "teams"
    assert listed["finance"]["teams"] == [{"id": team.pk, "name": "analysts"}]
    assert listed["vault"]["access"] == "everyone"
    assert (
        api_client_for(world["bob"]).patch(url, {"access": "teams"}, format="json").status_code
        == 403
    )
    made = staff.post(
        "/api/admin/datasources",
        {"slug": "fresh", "name": "Fresh", "dialect": "sqlite",
         "connection": {"database": str(world["datasources"]["open"].connection["database"])}},
        format="json",
    )  # fmt: skip
    assert made.status_code == 201 and made.json()["access"] == "teams"  # staff only at first
    assert "fresh" not in slugs(api_client_for(world["bob"]).get("/api/datasources"))


def test_the_admin_sets_access_and_teams_and_a_team_page_shows_its_datasources(world, client):
    from tests.conftest import PASSWORD

    client.login(username="operator", password=PASSWORD)
    datasource = world["datasources"]["vault"]
    page = client.get(f"/admin/secrets_vault/datasource/{datasource.pk}/change/").content.decode()
    assert 'name="access"' in page and 'name="teams"' in page
    assert "Team credentials" in page
    team_page = client.get(f"/admin/teams/team/{world['team'].pk}/change/").content.decode()
    assert "Datasources limited to teams" in team_page
    assert f'value="{world["datasources"]["finance"].pk}" selected' in team_page
    assert KnowledgeEntry.objects.filter(datasource=datasource).exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
async def test_the_notice_of_a_lost_datasource_reaches_the_conversations_socket(world):
    """A tab open on the conversation (the chat page's websocket) is told, live, that the
    run goes without the datasource its person lost."""
    from channels.db import database_sync_to_async

    from conversations.services.runs import run_start
    from tests.conversations.test_websocket import connect, receive_until

    conversation = await database_sync_to_async(conversation_of)(
        world["bob"], datasources=["finance", "open"]
    )
    communicator = await connect(conversation)
    try:
        await database_sync_to_async(world["team"].user_set.remove)(world["bob"])
        run = await database_sync_to_async(run_start)(
            user=world["bob"], conversation_id=conversation.id, prompt="totals?"
        )
        messages = await receive_until(
            communicator,
            lambda m: m.get("type") == "run.event" and m["event"].get("type") == "notice",
        )
    finally:
        await communicator.disconnect()
    notice = messages[-1]
    assert notice["run_id"] == str(run.id)
    assert notice["event"]["code"] == "datasource_access_lost"
    assert "finance" in notice["event"]["message"]
    assert run.datasources == ["open"]
