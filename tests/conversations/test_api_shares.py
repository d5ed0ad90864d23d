"""Shared conversations over the REST API: a share for the owner's teams or for every
signed-in person is a snapshot (later messages only after an update), seen by its audience
only (404 for anyone else, after it was stopped, once it expired, and when PAW_SHARING no
longer allows it); a fork copies the transcript, the agent's memory and the files, and
keeps only the datasources the viewer may use."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import uuid
import zipfile
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from threading import Barrier

import pytest
from django.contrib.auth.models import Group
from django.db import connection
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from conversations.models import Conversation, ConversationFile, Run, RunEvent, Share
from conversations.selectors.runs import conversation_turns
from conversations.selectors.workspaces import share_root, workspace_path
from conversations.services import shares as services
from conversations.services.runs import run_start
from conversations.services.shares import MAX_SHARES_PER_CONVERSATION, share_create, share_fork
from conversations.services.workspaces import workspace_ensure
from paw_project.errors import InvalidRequest
from secrets_vault.models import Datasource
from secrets_vault.services import secret_set
from tests.conftest import PAW_AGENT, api_client_for, use_up_throttle
from tests.conversations.test_api_export import PNG, lines_of_a_run
from tests.factories import conversation_of, missing_id
from tests.live import wait_for
from tests.sandboxes.observe import finished
from tests.sandboxes.test_replace_memory import model_messages, script

pytestmark = pytest.mark.django_db

CSV = "day,tip\nSun,3.00\n"
CSV_SHA256 = hashlib.sha256(CSV.encode()).hexdigest()


def add_run(conversation, prompt: str, answer: str, *, status: str = "done") -> Run:
    """A run of ``conversation`` with the stored lines of a paw-agent run (text, a
    run_python call that wrote chart.png, the answer), its cursors after the others'."""
    run = Run.objects.create(
        conversation=conversation,
        user=conversation.user,
        prompt=prompt,
        answer=answer if status == "done" else "",
        status=status,
        finished_at=timezone.now() if status == "done" else None,
    )
    lines = lines_of_a_run(run)
    lines[-1]["answer"] = answer
    lines[-3]["text"] = answer
    start = conversation.event_cursor
    for cursor, line in enumerate(lines, start=start + 1):
        RunEvent.objects.create(
            conversation=conversation,
            run=run,
            cursor=cursor,
            type=line["type"],
            kind=line.get("kind", ""),
            payload=line,
        )
    conversation.event_cursor = start + len(lines)
    conversation.save(update_fields=["event_cursor"])
    return run


@pytest.fixture
def conversation(user):
    conversation = conversation_of(user, title="Tips by day")
    add_run(conversation, "Average tip?", "The average tip is **3.00**.")
    folder = workspace_ensure(conversation.id)
    (folder / "tips.csv").write_text(CSV)
    (folder / "chart.png").write_bytes(PNG)
    ConversationFile.objects.create(
        conversation=conversation, name="tips.csv", size=len(CSV), sha256=CSV_SHA256
    )
    return conversation


@pytest.fixture
def analysts(user, make_user):
    """A team of alice's, with bob in it."""
    team = Group.objects.create(name="analysts")
    team.user_set.add(user, make_user("bob"))
    return team


@pytest.fixture
def bob(analysts):
    return api_client_for(analysts.user_set.get(username="bob"))


@pytest.fixture
def carol(make_user):
    """A signed-in person of another team."""
    person = make_user("carol")
    Group.objects.create(name="finance").user_set.add(person)
    return api_client_for(person)


def share(api, conversation, **body):
    return api.post(f"/api/conversations/{conversation.id}/shares", body, format="json")


def test_a_share_for_a_team_is_seen_by_its_members_only(api, conversation, analysts, bob, carol):
    response = share(api, conversation, audience="teams", teams=[analysts.id])
    assert response.status_code == 201, response.json()
    made = response.json()
    assert set(made) >= {"id", "url", "audience", "teams", "created"}
    assert made["audience"] == "teams" and made["teams"] == [analysts.id]
    assert made["url"].endswith(f"/s/{made['id']}/") and made["status"] == "active"
    assert made["expires"] is None and made["conversation"]["id"] == str(conversation.id)
    assert Share.objects.get(id=made["id"]).id.version == 4  # random: cannot be guessed

    seen = bob.get(f"/api/shares/{made['id']}")
    assert seen.status_code == 200, seen.json()
    body = seen.json()
    assert body["title"] == "Tips by day" and body["shared_by"] == "alice"
    assert body["is_owner"] is False
    assert {f["path"]: f["upload"] for f in body["files"]} == {"chart.png": False, "tips.csv": True}
    runs = bob.get(f"/api/shares/{made['id']}/runs").json()["results"]
    assert [r["prompt"] for r in runs] == ["Average tip?"]
    # The answer's relative images and links point at the share's files, not the workspace.
    assert "/api/conversations/" not in runs[0]["answer_html"]
    events = bob.get(f"/api/shares/{made['id']}/events?limit=1000").json()
    assert [e["event"]["type"] for e in events["events"]][-1] == "result"
    assert events["has_more"] is False
    tool = next(e for e in events["events"] if e["kind"] == "tool")
    assert tool["event"]["data"]["files"] == ["chart.png"]
    download = bob.get(f"/api/shares/{made['id']}/files/chart.png?inline=1")
    assert download.status_code == 200 and b"".join(download.streaming_content) == PNG
    assert download["Content-Security-Policy"] == "default-src 'none'; sandbox"

    # Another team, and anyone not signed in: as if there were no such share.
    for path in ("", "/runs", "/events", "/files/chart.png"):
        refused = carol.get(f"/api/shares/{made['id']}{path}")
        assert refused.status_code == 404, path
        assert refused.json() == {"detail": "No such share.", "code": "not_found"}
    assert carol.post(f"/api/shares/{made['id']}/fork").status_code == 404
    assert api_client_for(None).get(f"/api/shares/{made['id']}").status_code == 401
    assert carol.get(f"/api/shares/{missing_id()}").status_code == 404


def test_a_share_for_every_signed_in_person(api, conversation, carol):
    made = share(api, conversation, audience="signed_in").json()
    assert made["audience"] == "signed_in" and made["teams"] == []
    assert carol.get(f"/api/shares/{made['id']}").status_code == 200
    listed = api.get(f"/api/conversations/{conversation.id}/shares").json()["shares"]
    assert [s["id"] for s in listed] == [made["id"]]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"audience": "teams", "teams": ["finance"]}, "invalid"),
        ({"audience": "teams"}, "teams_required"),
        ({"audience": "teams", "teams": []}, "teams_required"),
        ({"audience": "signed_in", "teams": [1]}, "invalid_teams"),
        ({"audience": "everyone"}, "invalid_choice"),
        ({"audience": "signed_in", "expires_in_days": 0}, "min_value"),
        ({"audience": "signed_in", "expires_in_days": 366}, "max_value"),
        ({"audience": "signed_in", "public": True}, "unknown_field"),
    ],
)
def test_bad_share_requests_are_400_and_share_nothing(api, conversation, body, code):
    response = share(api, conversation, **body)
    assert response.status_code == 400, response.json()
    assert response.json()["code"] == code
    assert not Share.objects.exists()


def test_a_team_the_owner_is_not_a_member_of_is_400_naming_it(api, conversation, analysts, carol):
    finance = Group.objects.get(name="finance")
    response = share(api, conversation, audience="teams", teams=[analysts.id, finance.id])
    assert response.status_code == 400
    assert response.json()["code"] == "unknown_team" and response.json()["teams"] == [finance.id]
    assert str(finance.id) in response.json()["detail"]
    assert not Share.objects.exists()


def test_only_the_owner_shares_lists_and_stops(api, other_api, conversation):
    assert share(other_api, conversation, audience="signed_in").status_code == 404
    made = share(api, conversation, audience="signed_in").json()
    base = f"/api/conversations/{conversation.id}/shares/{made['id']}"
    assert other_api.delete(base).status_code == 404
    assert other_api.post(f"{base}/update", {}, format="json").status_code == 404
    assert other_api.get(f"/api/conversations/{conversation.id}/shares").status_code == 404
    assert other_api.get("/api/shares").json()["results"] == []
    assert [s["id"] for s in api.get("/api/shares").json()["results"]] == [made["id"]]


def test_stop_sharing_the_link_stops_at_once_and_its_files_go(
    api, conversation, carol, django_capture_on_commit_callbacks
):
    made = share(api, conversation, audience="signed_in").json()
    assert carol.get(f"/api/shares/{made['id']}").status_code == 200
    folder = share_root(made["id"])
    assert (folder / "1" / "chart.png").read_bytes() == PNG

    with django_capture_on_commit_callbacks(execute=True):
        response = api.delete(f"/api/conversations/{conversation.id}/shares/{made['id']}")
    assert response.status_code == 204
    assert not folder.exists()
    for path in ("", "/runs", "/events", "/files/chart.png"):
        assert carol.get(f"/api/shares/{made['id']}{path}").status_code == 404
    assert carol.post(f"/api/shares/{made['id']}/fork").status_code == 404
    assert api.get("/api/shares").json()["results"] == []


def test_the_shares_go_with_their_conversation(
    api, conversation, carol, django_capture_on_commit_callbacks
):
    made = share(api, conversation, audience="signed_in").json()
    with django_capture_on_commit_callbacks(execute=True):
        assert api.delete(f"/api/conversations/{conversation.id}").status_code == 204
    assert carol.get(f"/api/shares/{made['id']}").status_code == 404
    assert not share_root(made["id"]).exists()


def test_a_share_expires(api, conversation, carol):
    made = share(api, conversation, audience="signed_in", expires_in_days=7).json()
    expires = Share.objects.get(id=made["id"]).expires_at
    assert timedelta(days=7) - timedelta(minutes=1) < expires - timezone.now() <= timedelta(days=7)
    assert made["expires"] is not None
    assert carol.get(f"/api/shares/{made['id']}").status_code == 200

    Share.objects.filter(id=made["id"]).update(expires_at=timezone.now() - timedelta(seconds=1))
    assert carol.get(f"/api/shares/{made['id']}").status_code == 404
    assert api.get(f"/api/shares/{made['id']}").status_code == 404  # the owner's link too
    (listed,) = api.get("/api/shares").json()["results"]
    assert listed["status"] == "expired"

    # An update with a new expiry makes it work again, under the same link.
    base = f"/api/conversations/{conversation.id}/shares/{made['id']}"
    renewed = api.post(f"{base}/update", {"expires_in_days": 1}, format="json")
    assert renewed.status_code == 200 and renewed.json()["status"] == "active"
    assert carol.get(f"/api/shares/{made['id']}").status_code == 200
    never = api.post(f"{base}/update", {"expires_in_days": None}, format="json").json()
    assert never["expires"] is None


def test_a_share_is_a_snapshot_until_it_is_updated(
    api, conversation, carol, django_capture_on_commit_callbacks
):
    made = share(api, conversation, audience="signed_in").json()
    active = add_run(conversation, "Median tip?", "", status="running")  # not finished: left out
    url = f"/api/shares/{made['id']}"
    assert [r["prompt"] for r in carol.get(f"{url}/runs").json()["results"]] == ["Average tip?"]

    # Later messages, and the agent rewriting a file: the share shows neither.
    Run.objects.filter(id=active.id).update(status="done", answer="The median is 2.90.")
    add_run(conversation, "Highest tip?", "The highest tip is 10.00.")
    (workspace_path(conversation.id) / "chart.png").write_bytes(PNG + b"later")
    runs = carol.get(f"{url}/runs").json()["results"]
    assert [r["prompt"] for r in runs] == ["Average tip?"]
    events = carol.get(f"{url}/events?limit=1000").json()["events"]
    assert {e["run_id"] for e in events} == {runs[0]["id"]}
    assert b"".join(carol.get(f"{url}/files/chart.png").streaming_content) == PNG

    with django_capture_on_commit_callbacks(execute=True):
        updated = api.post(
            f"/api/conversations/{conversation.id}/shares/{made['id']}/update", {}, format="json"
        )
    assert updated.status_code == 200
    assert updated.json()["id"] == made["id"] and updated.json()["url"] == made["url"]
    assert updated.json()["updated"] > made["updated"]
    runs = carol.get(f"{url}/runs").json()["results"]
    assert [r["prompt"] for r in runs] == ["Average tip?", "Median tip?", "Highest tip?"]
    events = carol.get(f"{url}/events?limit=1000").json()["events"]
    assert events[-1]["event"]["answer"] == "The highest tip is 10.00."
    assert b"".join(carol.get(f"{url}/files/chart.png").streaming_content) == PNG + b"later"
    assert sorted(p.name for p in share_root(made["id"]).iterdir()) == ["2"]  # the old one went


def test_events_are_paged_by_cursor(api, conversation, carol):
    add_run(conversation, "Median tip?", "The median is 2.90.")
    made = share(api, conversation, audience="signed_in").json()
    seen, after = [], 0
    while True:
        page = carol.get(f"/api/shares/{made['id']}/events?after={after}&limit=5").json()
        seen += page["events"]
        after = page["next_after"]
        if not page["has_more"]:
            break
    assert len(seen) == 2 * len(lines_of_a_run(Run.objects.first()))
    assert [e["cursor"] for e in seen] == sorted({e["cursor"] for e in seen})


def test_paw_sharing_narrowed_stops_the_shares_it_no_longer_allows(
    api, conversation, analysts, bob, carol, settings
):
    everyone = share(api, conversation, audience="signed_in").json()
    team = share(api, conversation, audience="teams", teams=[analysts.id]).json()

    settings.PAW_SHARING = "teams"
    assert carol.get(f"/api/shares/{everyone['id']}").status_code == 404
    assert bob.get(f"/api/shares/{everyone['id']}").status_code == 404
    assert bob.get(f"/api/shares/{team['id']}").status_code == 200
    refused = share(api, conversation, audience="signed_in")
    assert refused.status_code == 400 and refused.json()["code"] == "audience_not_allowed"
    statuses = {s["id"]: s["status"] for s in api.get("/api/shares").json()["results"]}
    assert statuses == {everyone["id"]: "not_allowed", team["id"]: "active"}

    settings.PAW_SHARING = "off"
    assert bob.get(f"/api/shares/{team['id']}").status_code == 404
    refused = share(api, conversation, audience="teams", teams=[analysts.id])
    assert refused.status_code == 403 and refused.json()["code"] == "sharing_off"

    settings.PAW_SHARING = "signed_in"  # widened again: they work again
    assert carol.get(f"/api/shares/{everyone['id']}").status_code == 200


def test_a_fork_copies_the_transcript_memory_and_files_and_only_usable_datasources(
    api, conversation, analysts, carol
):
    # tips: everyone's; sales: the analysts' only (carol is not one); old: disabled.
    for slug, access, enabled in (
        ("tips", "everyone", True), ("sales", "teams", True), ("old", "everyone", False),
    ):  # fmt: skip
        source = Datasource.objects.create(
            slug=slug, name=slug.title(), dialect="sqlite", connection={"database": "x.db"},
            access=access, enabled=enabled,
        )  # fmt: skip
        if access == "teams":
            source.teams.add(analysts)
    conversation.datasources = ["tips", "sales", "old"]
    conversation.save(update_fields=["datasources"])
    Run.objects.filter(conversation=conversation).update(datasources=["tips", "sales", "old"])
    made = share(api, conversation, audience="signed_in").json()

    response = carol.post(f"/api/shares/{made['id']}/fork")
    assert response.status_code == 201, response.json()
    fork = Conversation.objects.get(id=response.json()["id"])
    assert fork.user.username == "carol" and fork.title == "Tips by day (fork)"
    assert fork.datasources == ["tips"]  # sales and old: not ones carol may use
    assert fork.llm_provider == ""  # no model choice of alice's
    (run,) = Run.objects.filter(conversation=fork)
    assert run.user == fork.user and run.datasources == ["tips"] and run.usage == {}
    # The agent's memory of the fork: what a new sandbox is seeded with.
    assert conversation_turns(conversation_id=fork.id, limit=10) == [
        {"prompt": "Average tip?", "answer": "The average tip is **3.00**."}
    ]
    # The transcript, under the fork's own cursors, then a notice saying where it came from.
    events = list(RunEvent.objects.filter(conversation=fork).order_by("cursor"))
    originals = RunEvent.objects.filter(conversation=conversation).count()
    assert [e.cursor for e in events] == list(range(1, originals + 2))
    assert {e.run_id for e in events[:-1]} == {run.id}
    assert events[-1].kind == "forked" and "alice" in events[-1].payload["message"]
    assert "Left out, as you may not use them: old, sales." in events[-1].payload["message"]
    assert fork.event_cursor == originals + 1
    # The files: the upload as an upload, the chart as the agent's.
    assert (workspace_path(fork.id) / "chart.png").read_bytes() == PNG
    assert (workspace_path(fork.id) / "tips.csv").read_text() == CSV
    (upload,) = ConversationFile.objects.filter(conversation=fork)
    assert upload.name == "tips.csv" and upload.sha256 == CSV_SHA256
    artifacts = carol.get(f"/api/conversations/{fork.id}/artifacts").json()["results"]
    assert [a["path"] for a in artifacts] == ["chart.png"]
    history = carol.get(f"/api/conversations/{fork.id}/history").json()["results"]
    assert [(t["prompt"], t["in_memory"]) for t in history] == [("Average tip?", True)]
    # The shared conversation is untouched.
    assert Run.objects.filter(conversation=conversation).count() == 1
    assert conversation.user.conversations.count() == 1


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_agent_of_a_fork_remembers_the_shared_turns(worker_node, scripted_model, make_user):
    """Through a real worker and paw-agent: the fork's first run is seeded with the
    shared conversation's turns, as the owner's next run would be."""
    worker_node.use(PAW_AGENT)
    owner, viewer = make_user("alice"), make_user("carol")
    conversation = conversation_of(owner, title="Numbers")

    def done(run: Run) -> Run:
        run = wait_for(lambda: finished(run.id), what="the run to end")
        assert run.status == Run.Status.DONE, run.errors
        return run

    scripted_model.load(script("Noted: 42."))
    done(run_start(user=owner, conversation_id=conversation.id, prompt="Remember the number 42."))
    shared = share_create(user=owner, conversation_id=conversation.id, audience="signed_in")
    fork = share_fork(user=viewer, share_id=shared.id)

    scripted_model.load(script("It was 42."))
    scripted_model.clear_log()
    asked = done(run_start(user=viewer, conversation_id=fork.id, prompt="What was the number?"))
    assert asked.answer == "It was 42."
    for said in model_messages(scripted_model, "What was the number?"):
        assert "Remember the number 42." in said and "Noted: 42." in said


def test_no_secret_of_the_owner_reaches_the_share_or_a_fork(api, conversation, carol):
    """A file the agent wrote the owner's secret into: text is masked as events are, a
    binary file holding it is left out (the suite's leak scan checks every answer too)."""
    token = f"tok-{uuid.uuid4().hex}"
    secret_set(name="MY_TOKEN", value=token, user=conversation.user)
    folder = workspace_path(conversation.id)
    (folder / "env.txt").write_text(f"HOME=/x\nMY_TOKEN={token}\n")
    (folder / "blob.bin").write_bytes(b"\x00\x01" + token.encode() + b"\x00")
    made = share(api, conversation, audience="signed_in").json()
    assert made["files_left_out"] == [
        {"path": "blob.bin", "size": len(token) + 3, "reason": "holds a secret"}
    ]
    url = f"/api/shares/{made['id']}"
    assert "blob.bin" not in {f["path"] for f in carol.get(url).json()["files"]}
    assert carol.get(f"{url}/files/blob.bin").status_code == 404
    text = b"".join(carol.get(f"{url}/files/env.txt").streaming_content).decode()
    assert text == "HOME=/x\nMY_TOKEN=[secret:MY_TOKEN]\n"
    fork = carol.post(f"{url}/fork").json()
    assert (workspace_path(fork["id"]) / "env.txt").read_text() == text
    assert not (workspace_path(fork["id"]) / "blob.bin").exists()


def test_sharing_and_forking_are_throttled_reading_is_not(api, conversation, carol, settings):
    made = share(api, conversation, audience="signed_in").json()
    use_up_throttle("shares", f"user-{conversation.user.pk}", settings.PAW_THROTTLE_UPLOADS)
    refused = share(api, conversation, audience="signed_in")
    assert refused.status_code == 429 and refused.json()["code"] == "throttled"
    assert int(refused["Retry-After"]) > 0
    base = f"/api/conversations/{conversation.id}/shares"
    assert api.post(f"{base}/{made['id']}/update", {}, format="json").status_code == 429
    assert api.get(base).status_code == 200
    assert Share.objects.count() == 1
    carol_id = carol.get("/api/auth/me").json()["id"]
    use_up_throttle("shares", f"user-{carol_id}", settings.PAW_THROTTLE_UPLOADS)
    assert carol.post(f"/api/shares/{made['id']}/fork").status_code == 429
    assert carol.get(f"/api/shares/{made['id']}").status_code == 200


def test_an_operator_lists_and_stops_shares_in_the_admin(
    api, conversation, carol, make_user, django_capture_on_commit_callbacks
):
    made = share(api, conversation, audience="signed_in").json()
    operator = Client()
    operator.force_login(make_user("operator", is_staff=True, is_superuser=True))
    listed = operator.get(reverse("admin:conversations_share_changelist"))
    assert listed.status_code == 200 and made["id"] in listed.content.decode()
    page = operator.get(reverse("admin:conversations_share_change", args=[made["id"]]))
    assert page.status_code == 200 and "alice" in page.content.decode()
    with django_capture_on_commit_callbacks(execute=True):
        deleted = operator.post(
            reverse("admin:conversations_share_delete", args=[made["id"]]), {"post": "yes"}
        )
    assert deleted.status_code == 302
    assert carol.get(f"/api/shares/{made['id']}").status_code == 404
    assert not share_root(made["id"]).exists()


def test_a_team_member_forks_with_the_teams_datasource(api, conversation, analysts, bob):
    """The same rule for a viewer who may use the team's datasource: it is kept."""
    source = Datasource.objects.create(
        slug="sales", name="Sales", dialect="sqlite", connection={"database": "x.db"},
        access="teams",
    )  # fmt: skip
    source.teams.add(analysts)
    conversation.datasources = ["sales"]
    conversation.save(update_fields=["datasources"])
    made = share(api, conversation, audience="teams", teams=[analysts.id]).json()
    fork = bob.post(f"/api/shares/{made['id']}/fork").json()
    assert fork["datasources"] == ["sales"]


def test_the_pages_a_share_has_and_the_chats_share_button(
    api, conversation, analysts, carol, settings
):
    made = share(api, conversation, audience="teams", teams=[analysts.id]).json()
    bob, carol_user = Client(), Client()
    bob.force_login(analysts.user_set.get(username="bob"))
    carol_user.force_login(Group.objects.get(name="finance").user_set.get())
    page = bob.get(f"/s/{made['id']}/")
    assert page.status_code == 200
    assert "Shared by <strong>alice</strong>" in page.content.decode()
    assert page["Content-Security-Policy"]  # as every page of PAW
    refused = carol_user.get(f"/s/{made['id']}/")
    assert refused.status_code == 404 and "Tips by day" not in refused.content.decode()
    assert Client().get(f"/s/{made['id']}/").status_code == 302  # to the sign-in page
    assert bob.get("/shares/").status_code == 200

    owner = Client()
    owner.force_login(conversation.user)
    chat = owner.get(f"/c/{conversation.id}/").content.decode()
    assert 'id="share-conversation"' in chat and 'value="signed_in"' in chat
    assert f'value="{analysts.id}"> analysts' in chat  # her team, to tick
    settings.PAW_SHARING = "teams"
    chat = owner.get(f"/c/{conversation.id}/").content.decode()
    assert 'id="share-conversation"' in chat and 'value="signed_in"' not in chat
    settings.PAW_SHARING = "off"
    assert 'id="share-conversation"' not in owner.get(f"/c/{conversation.id}/").content.decode()


def test_a_snapshots_versions_are_its_own(api, conversation, carol):
    """An edited turn shared with both versions; a version made after the share is not
    named by the shared runs (nor shown) until the share is updated."""
    first = Run.objects.get(conversation=conversation)
    second = add_run(conversation, "Average tip, rounded?", "About 3.")
    Run.objects.filter(id=second.id).update(replaces=first)
    made = share(api, conversation, audience="signed_in").json()
    third = add_run(conversation, "Average tip, exactly?", "2.998.")
    Run.objects.filter(id=third.id).update(replaces=second)

    runs = carol.get(f"/api/shares/{made['id']}/runs").json()["results"]
    assert [r["id"] for r in runs] == [str(first.id), str(second.id)]
    assert runs[1]["versions"] == [str(first.id), str(second.id)]
    assert runs[1]["replaced_by"] is None and runs[1]["version"] == 2
    # The owner's own view names the new version.
    mine = api.get(f"/api/conversations/{conversation.id}/runs/{second.id}").json()
    assert mine["replaced_by"] == str(third.id)


def test_an_owner_who_left_the_team_shares_with_it_no_more(api, conversation, analysts, bob):
    """The owner's membership counts at every view: once she left the share's team, its
    members get a 404, her share is `not_allowed` and an update is refused naming it."""
    made = share(api, conversation, audience="teams", teams=[analysts.id]).json()
    assert bob.get(f"/api/shares/{made['id']}").status_code == 200
    analysts.user_set.remove(conversation.user)
    for path in ("", "/runs", "/events", "/files/chart.png"):
        assert bob.get(f"/api/shares/{made['id']}{path}").status_code == 404, path
    assert bob.post(f"/api/shares/{made['id']}/fork").status_code == 404
    (listed,) = api.get("/api/shares").json()["results"]
    assert listed["status"] == "not_allowed" and listed["teams"] == []
    base = f"/api/conversations/{conversation.id}/shares/{made['id']}"
    refused = api.post(f"{base}/update", {}, format="json")
    assert refused.status_code == 400, refused.json()
    assert refused.json()["code"] == "unknown_team" and refused.json()["teams"] == [analysts.id]
    assert str(analysts.id) in refused.json()["detail"]


def test_a_share_shows_only_the_teams_its_owner_is_still_in(api, conversation, analysts, bob):
    other = Group.objects.create(name="ops")
    other.user_set.add(conversation.user)
    made = share(api, conversation, audience="teams", teams=[analysts.id, other.id]).json()
    other.user_set.remove(conversation.user)
    (listed,) = api.get("/api/shares").json()["results"]
    assert listed["status"] == "active" and listed["teams"] == [analysts.id]
    assert bob.get(f"/api/shares/{made['id']}").json()["teams"] == [analysts.id]


def test_a_share_whose_team_was_deleted_is_not_allowed(api, conversation, analysts, bob):
    made = share(api, conversation, audience="teams", teams=[analysts.id]).json()
    analysts.delete()
    (listed,) = api.get("/api/shares").json()["results"]
    assert listed["status"] == "not_allowed" and listed["teams"] == []
    assert bob.get(f"/api/shares/{made['id']}").status_code == 404
    base = f"/api/conversations/{conversation.id}/shares/{made['id']}"
    refused = api.post(f"{base}/update", {}, format="json")
    assert refused.status_code == 400 and refused.json()["code"] == "teams_required"


def test_a_deactivated_owners_shares_stop(api, conversation, carol):
    made = share(api, conversation, audience="signed_in").json()
    conversation.user.is_active = False
    conversation.user.save(update_fields=["is_active"])
    for path in ("", "/runs", "/events", "/files/chart.png"):
        refused = carol.get(f"/api/shares/{made['id']}{path}")
        assert refused.status_code == 404, path
        assert refused.json() == {"detail": "No such share.", "code": "not_found"}
    assert carol.post(f"/api/shares/{made['id']}/fork").status_code == 404
    assert Share.objects.get(id=made["id"]).conversation.user.is_active is False


@pytest.mark.django_db(transaction=True)
def test_shares_made_at_once_stay_within_the_limit(make_user):
    """40 shares of one conversation made at once: the conversation's row is locked while
    each is counted and made, so exactly the limit are made and the rest refused."""
    owner = make_user("alice")
    conversation = conversation_of(owner, title="Tips")
    (workspace_ensure(conversation.id) / "tips.csv").write_text(CSV)
    attempts = 2 * MAX_SHARES_PER_CONVERSATION
    barrier = Barrier(attempts)

    def attempt(_: int) -> str:
        try:
            barrier.wait(timeout=30)
            share_create(user=owner, conversation_id=conversation.id, audience="signed_in")
            return "made"
        except InvalidRequest as error:
            return error.code
        finally:
            connection.close()

    with ThreadPoolExecutor(attempts) as pool:
        outcomes = list(pool.map(attempt, range(attempts)))
    assert outcomes.count("made") == MAX_SHARES_PER_CONVERSATION
    assert outcomes.count("too_many_shares") == attempts - MAX_SHARES_PER_CONVERSATION
    assert Share.objects.filter(conversation=conversation).count() == MAX_SHARES_PER_CONVERSATION


def test_a_forks_notice_names_the_datasources_its_runs_used_too(api, conversation, analysts, carol):
    """A datasource a shared run used, though no longer one of the conversation's, is
    left out of the fork too, and its notice names it."""
    for slug, access in (("tips", "everyone"), ("sales", "teams")):
        source = Datasource.objects.create(
            slug=slug, name=slug.title(), dialect="sqlite", connection={"database": "x.db"},
            access=access,
        )  # fmt: skip
        if access == "teams":
            source.teams.add(analysts)
    conversation.datasources = ["tips"]
    conversation.save(update_fields=["datasources"])
    Run.objects.filter(conversation=conversation).update(datasources=["tips", "sales"])
    made = share(api, conversation, audience="signed_in").json()
    fork = Conversation.objects.get(id=carol.post(f"/api/shares/{made['id']}/fork").json()["id"])
    (run,) = Run.objects.filter(conversation=fork)
    assert run.datasources == ["tips"]
    notice = RunEvent.objects.filter(conversation=fork).order_by("cursor").last()
    assert "Left out, as you may not use them: sales." in notice.payload["message"]


def test_a_shares_runs_hold_no_model_settings_or_usage(api, conversation, carol):
    """docs/chat.md: a share shows never the owner's model settings: its runs name no
    provider, model or token usage (the owner's own runs do)."""
    Run.objects.filter(conversation=conversation).update(
        provider="secret-provider", model="secret-model", usage={"input": 12, "output": 34}
    )
    made = share(api, conversation, audience="signed_in").json()
    (run,) = carol.get(f"/api/shares/{made['id']}/runs").json()["results"]
    assert run["prompt"] == "Average tip?"
    assert not {"provider", "model", "usage"} & set(run)
    assert "secret-model" not in str(run) and "secret-provider" not in str(run)
    mine = api.get(f"/api/conversations/{conversation.id}/runs/{run['id']}").json()
    assert mine["model"] == "secret-model" and mine["usage"]["input"] == 12


def test_a_file_growing_while_it_is_copied_stays_within_the_limits(
    api, conversation, carol, settings, monkeypatch
):
    """The listing's size is not trusted: a file that grew past PAW_MAX_UPLOAD_BYTES, or
    past what is left of the total, after it was listed is copied no further than the
    limit and left out (named in files_left_out), nothing of it in the snapshot."""
    folder = workspace_path(conversation.id)
    settings.PAW_MAX_UPLOAD_BYTES = 1000
    monkeypatch.setattr(services, "SHARE_MAX_FILES_BYTES", 1500)
    (folder / "a-grown.txt").write_text("x" * 5000)  # past the file limit
    (folder / "b-fits.txt").write_text("y" * 900)
    (folder / "c-grown.txt").write_text("z" * 999)  # within it, past the total's rest
    listed = services.workspace_files

    def as_listed_before(conversation_id):
        """The sizes as they were listed, before the files grew."""
        return [
            dataclasses.replace(entry, size=10) if "grown" in entry.path else entry
            for entry in listed(conversation_id)
        ]

    monkeypatch.setattr(services, "workspace_files", as_listed_before)
    (folder / "chart.png").write_bytes(PNG)  # len(PNG) + 900 + CSV: below the total
    made = share(api, conversation, audience="signed_in").json()
    left_out = {entry["path"]: entry["reason"] for entry in made["files_left_out"]}
    assert left_out == {
        "a-grown.txt": "larger than PAW_MAX_UPLOAD_BYTES",
        "c-grown.txt": "past 0 MiB of files in all",
    }
    shared = {f["path"] for f in carol.get(f"/api/shares/{made['id']}").json()["files"]}
    assert shared == {"b-fits.txt", "chart.png", "tips.csv"}
    snapshot = share_root(made["id"]) / "1"
    assert not (snapshot / "a-grown.txt").exists() and not (snapshot / "c-grown.txt").exists()
    assert sum(p.stat().st_size for p in snapshot.rglob("*") if p.is_file()) <= 1500


def test_forks_are_bounded_per_day_too(api, conversation, carol, settings):
    """Each fork copies up to 256 MiB of files: past PAW_THROTTLE_FORKS (20 a day by
    default), within the per-minute rate, a fork is 429; viewing is not counted."""
    assert settings.PAW_THROTTLE_FORKS == "20/day"
    made = share(api, conversation, audience="signed_in").json()
    settings.PAW_THROTTLE_FORKS = "2/day"
    assert carol.post(f"/api/shares/{made['id']}/fork").status_code == 201
    assert carol.post(f"/api/shares/{made['id']}/fork").status_code == 201
    refused = carol.post(f"/api/shares/{made['id']}/fork")
    assert refused.status_code == 429 and refused.json()["code"] == "throttled"
    assert int(refused["Retry-After"]) > 60  # the day's window, not a minute's
    assert carol.get(f"/api/shares/{made['id']}").status_code == 200
    assert Conversation.objects.filter(user__username="carol").count() == 2


def _xlsx_with(text: str) -> bytes:
    """A small xlsx-like zip whose shared strings (deflated) hold ``text``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("[Content_Types].xml", "<Types/>")
        archive.writestr("xl/sharedStrings.xml", f"<sst><si><t>{text}</t></si></sst>" * 50)
    return buffer.getvalue()


def test_a_compressed_or_utf16_file_holding_a_secret_is_left_out(api, conversation, carol):
    """The owner's secret in an xlsx cell, in a gzip, in a zip, in UTF-16 text (either
    byte order): each file is left out, as a binary file holding it is; the same files
    without it are shared."""
    token = f"tok-{uuid.uuid4().hex}"
    secret_set(name="MY_TOKEN", value=token, user=conversation.user)
    folder = workspace_path(conversation.id)
    (folder / "book.xlsx").write_bytes(_xlsx_with(f"key {token}"))
    (folder / "env.txt.gz").write_bytes(gzip.compress(f"MY_TOKEN={token}\n".encode()))
    (folder / "le.txt").write_bytes(f"MY_TOKEN={token}\n".encode("utf-16"))
    (folder / "be.txt").write_bytes(f"MY_TOKEN={token}\n".encode("utf-16-be"))
    (folder / "clean.xlsx").write_bytes(_xlsx_with("no secret here"))
    (folder / "clean.gz").write_bytes(gzip.compress(b"nothing to hide\n"))
    (folder / "clean16.txt").write_bytes("nothing to hide\n".encode("utf-16"))
    assert token.encode() not in (folder / "book.xlsx").read_bytes()  # deflated away
    made = share(api, conversation, audience="signed_in").json()
    left_out = {entry["path"]: entry["reason"] for entry in made["files_left_out"]}
    assert left_out == dict.fromkeys(
        ("be.txt", "book.xlsx", "env.txt.gz", "le.txt"), "holds a secret"
    )
    url = f"/api/shares/{made['id']}"
    shared = {f["path"] for f in carol.get(url).json()["files"]}
    assert {"clean.xlsx", "clean.gz", "clean16.txt"} <= shared
    assert not shared & set(left_out)
    for path in left_out:
        assert carol.get(f"{url}/files/{path}").status_code == 404


def test_a_zip_bomb_costs_no_more_than_the_inflation_bound(api, conversation, monkeypatch):
    """A zip (or gzip) inflating past SCAN_MAX_INFLATED_BYTES is left out unchecked: its
    members are inflated no further than the bound, in all."""
    monkeypatch.setattr(services, "SCAN_MAX_INFLATED_BYTES", 1024 * 1024)
    token = f"tok-{uuid.uuid4().hex}"
    secret_set(name="MY_TOKEN", value=token, user=conversation.user)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for number in range(3):  # each under the bound, together past it
            archive.writestr(f"part{number}.txt", b"\0" * (512 * 1024))
        archive.writestr("last.txt", token)  # past the bound: never reached
    folder = workspace_path(conversation.id)
    (folder / "bomb.zip").write_bytes(buffer.getvalue())
    (folder / "bomb.gz").write_bytes(gzip.compress(b"\0" * (2 * 1024 * 1024) + token.encode()))
    inflated = []
    read = services._Inflated.read

    def counted(self, stream):
        for chunk in read(self, stream):
            inflated.append(len(chunk))
            yield chunk

    monkeypatch.setattr(services._Inflated, "read", counted)
    made = share(api, conversation, audience="signed_in").json()
    left_out = {entry["path"]: entry["reason"] for entry in made["files_left_out"]}
    assert set(left_out) == {"bomb.zip", "bomb.gz"}
    assert all("not checked for secrets" in reason for reason in left_out.values())
    assert sum(inflated) <= 2 * (1024 * 1024 + services.COPY_BYTES)  # two files' bounds
