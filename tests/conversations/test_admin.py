"""The operators' admin for conversations: every approval's audit trail (who decided, how,
when) and the policy violations of runtimes that skipped asking."""

from __future__ import annotations

import re

import pytest
from django.contrib.admin.utils import display_for_field
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from conversations.models import Approval, Run, RunEvent
from conversations.services.approvals import approval_create, approval_decide, approval_expire
from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.scenarios import FAKE


@pytest.fixture
def operator_client(make_user) -> Client:
    client = Client()
    client.force_login(make_user("operator", is_staff=True, is_superuser=True))
    return client


def confirm_of(run: Run, prompt: str) -> Approval:
    return approval_create(run=run, data={"kind": "confirm", "prompt": prompt, "ask_id": prompt})


def cell(approval: Approval, field: str) -> str:
    """A changelist cell as the admin renders it (``-`` when empty)."""
    value = getattr(approval, field)
    return display_for_field(value, Approval._meta.get_field(field), "-")


def changelist_row(html: str, object_id) -> str:
    """The changelist's table row of the object with ``object_id``."""
    (row,) = [r for r in html.split("<tr")[1:] if f"/{object_id}/change/" in r]
    return row


def cells(row: str) -> dict[str, str]:
    """``{field: rendered text}`` of a changelist row's ``<td>`` cells."""
    return dict(re.findall(r'<td class="field-(\w+)(?: nowrap)?">([^<]*)</td>', row))


@pytest.mark.django_db
def test_the_approval_list_and_page_show_who_decided_how_and_when(operator_client):
    conversation = ConversationFactory(user__username="alice")
    run = Run.objects.create(conversation=conversation, user=conversation.user, prompt="clean up")
    decided = confirm_of(run, "shell: rm -rf build/")
    approval_decide(approval_id=decided.id, user=conversation.user, approved=False, via="websocket")
    expired = confirm_of(run, "delete_file: delete the file old.txt")
    approval_expire(approval_id=expired.id)
    pending = confirm_of(run, "shell: make dist")
    decided.refresh_from_db()
    expired.refresh_from_db()

    changelist = reverse("admin:conversations_approval_changelist")
    page = operator_client.get(changelist)
    assert page.status_code == 200
    trail = {
        "status": "Declined",
        "decided_by": "user",
        "decided_by_user": "alice",
        "via": "websocket",
        "decided_at": cell(decided, "decided_at"),
    }
    shown = cells(changelist_row(page.content.decode(), decided.id))
    assert {field: shown.get(field) for field in trail} == trail
    assert decided.decided_at is not None
    assert cells(changelist_row(page.content.decode(), pending.id))["decided_at"] == "-"

    # An operator narrows the list to what people decided, or to what timed out.
    by_people = operator_client.get(changelist, {"decided_by": "user"})
    assert [a.id for a in by_people.context["cl"].result_list] == [decided.id]
    timed_out = operator_client.get(changelist, {"decided_by": "timeout"})
    assert [a.id for a in timed_out.context["cl"].result_list] == [expired.id]
    open_ones = operator_client.get(changelist, {"status": "pending"})
    assert [a.id for a in open_ones.context["cl"].result_list] == [pending.id]

    detail = operator_client.get(reverse("admin:conversations_approval_change", args=[decided.id]))
    assert detail.status_code == 200
    text = detail.content.decode()
    for value in ("shell: rm -rf build/", "websocket", "alice", cell(decided, "decided_at")):
        assert value in text, value
    assert '<div class="readonly">user</div>' in text  # decided_by
    # The trail is read-only: no form to rewrite it.
    assert 'name="decided_by"' not in text and 'name="_save"' not in text
    change = operator_client.post(
        reverse("admin:conversations_approval_change", args=[decided.id]),
        {"status": "approved", "decided_by": "auto"},
    )
    assert change.status_code == 403
    decided.refresh_from_db()
    assert (decided.status, decided.decided_by) == ("declined", "user")


def decided_approval() -> Approval:
    conversation = ConversationFactory()
    run = Run.objects.create(conversation=conversation, user=conversation.user, prompt="go")
    approval = confirm_of(run, "shell: make")
    return approval_decide(approval_id=approval.id, user=conversation.user, approved=True)


@pytest.mark.django_db
def test_the_approval_list_reads_who_decided_without_a_query_per_row(operator_client):
    changelist = reverse("admin:conversations_approval_changelist")
    decided_approval()
    with CaptureQueriesContext(connection) as one_row:
        assert operator_client.get(changelist).status_code == 200
    for _ in range(5):
        decided_approval()
    with CaptureQueriesContext(connection) as six_rows:
        page = operator_client.get(changelist)
    assert len(page.context["cl"].result_list) == 6
    assert len(six_rows) == len(one_row), [q["sql"][:120] for q in six_rows.captured_queries]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_policy_violation_is_listed_in_the_admin(worker_node, operator_client):
    """A runtime that runs ``shell`` without asking (a test runtime that lies) is stopped;
    the operator finds the violation by filtering the events by type."""
    worker_node.use(FAKE, PAW_SANDBOX_ISOLATION="none")
    conversation = ConversationFactory()
    (workspace_ensure(conversation.id) / "fake_mode").write_text("lying")
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="go")
    run = wait_for(
        lambda: Run.objects.filter(id=run.id, status__in=Run.FINISHED_STATUSES).first(),
        what="the run to be stopped",
    )
    assert run.status == Run.Status.ERROR and run.errors[0]["code"] == "policy_violation"
    violation = RunEvent.objects.get(run=run, type="policy_violation")
    assert RunEvent.objects.filter(run=run).exclude(type="policy_violation").exists()

    changelist = reverse("admin:conversations_runevent_changelist")
    everything = operator_client.get(changelist)
    assert everything.status_code == 200
    assert "?type=policy_violation" in everything.content.decode()  # a filter choice
    filtered = operator_client.get(changelist, {"type": "policy_violation"})
    assert filtered.status_code == 200
    assert [e.id for e in filtered.context["cl"].result_list] == [violation.id]
    assert '<td class="field-type">policy_violation</td>' in filtered.content.decode()

    detail = operator_client.get(
        reverse("admin:conversations_runevent_change", args=[violation.id])
    )
    assert detail.status_code == 200
    text = detail.content.decode()
    assert "without your approval" in text and "shell" in text

    # The stopped run says why, too.
    runs = operator_client.get(reverse("admin:conversations_run_changelist"), {"status": "error"})
    assert [r.id for r in runs.context["cl"].result_list] == [run.id]
