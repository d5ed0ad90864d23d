"""The admin's audit: a read-only list of the SQL statements with filters (user, team,
datasource, date), and their CSV export (the selected rows, or every filtered row)."""

from __future__ import annotations

import csv
import io

import pytest
from django.contrib.auth.models import Group
from django.test import Client

from audit.models import SqlStatement
from tests.audit.records import recorded

pytestmark = pytest.mark.django_db

CHANGELIST = "/admin/audit/sqlstatement/"
EXPORT = "/admin/audit/sqlstatement/export.csv"


@pytest.fixture
def admin_client_(make_user) -> Client:
    client = Client()
    client.force_login(make_user("root", is_staff=True, is_superuser=True))
    return client


@pytest.fixture
def audit(user, other_user):
    analysts = Group.objects.create(name="analysts")
    user.groups.add(analysts)
    return {
        "analysts": analysts,
        "a1": recorded(user, time="2026-12-01T09:00", statement="SELECT 'a1'"),
        "a2": recorded(
            user,
            time="2026-12-02T09:00",
            datasource="warehouse",
            statement='=HYPERLINK("http://evil")',
            outcome="database_error",
            row_count=None,
            explained=True,
        ),
        "m1": recorded(other_user, time="2026-12-03T12:00", statement="SELECT 'm1'"),
    }


def shown(response) -> list[int]:
    assert response.status_code == 200
    return [row.id for row in response.context["cl"].result_list]


def csv_of(response) -> list[dict[str, str]]:
    assert response.status_code == 200
    assert response["Content-Type"] == "text/csv; charset=utf-8"
    assert response["Content-Disposition"].startswith('attachment; filename="paw-sql-audit-')
    text = b"".join(response.streaming_content).decode()
    return list(csv.DictReader(io.StringIO(text)))


def test_the_list_filters_by_user_team_datasource_and_date(admin_client_, audit):
    a1, a2, m1 = audit["a1"].id, audit["a2"].id, audit["m1"].id
    assert shown(admin_client_.get(CHANGELIST)) == [m1, a2, a1]
    assert shown(admin_client_.get(CHANGELIST, {"username": "alice"})) == [a2, a1]
    assert shown(admin_client_.get(CHANGELIST, {"team": str(audit["analysts"].pk)})) == [a2, a1]
    assert shown(admin_client_.get(CHANGELIST, {"datasource": "warehouse"})) == [a2]
    # What the date filter's links carry (aware bounds).
    day = {"time__gte": "2026-12-03 00:00:00+00:00", "time__lt": "2026-12-04 00:00:00+00:00"}
    assert shown(admin_client_.get(CHANGELIST, day)) == [m1]
    page = admin_client_.get(CHANGELIST).content.decode()
    assert 'id="audit-export-csv"' in page and "analysts" in page


def test_nobody_adds_changes_or_deletes_a_row(admin_client_, audit):
    row = audit["a1"]
    assert admin_client_.get(f"{CHANGELIST}add/").status_code == 403
    detail = admin_client_.get(f"{CHANGELIST}{row.id}/change/")
    assert detail.status_code == 200 and b"SELECT &#x27;a1&#x27;" in detail.content
    assert admin_client_.post(f"{CHANGELIST}{row.id}/change/", {"outcome": "ok"}).status_code == 403
    assert admin_client_.post(f"{CHANGELIST}{row.id}/delete/", {"post": "yes"}).status_code == 403
    actions = admin_client_.get(CHANGELIST).context["action_form"].fields["action"].choices
    assert [name for name, _ in actions if name] == ["export_csv"]
    assert SqlStatement.objects.count() == 3


def test_the_csv_export_of_the_filtered_list_and_of_selected_rows(admin_client_, audit, user):
    rows = csv_of(admin_client_.get(EXPORT, {"username": "alice"}))
    assert [r["statement"] for r in rows] == ['\'=HYPERLINK("http://evil")', "SELECT 'a1'"]
    assert rows[1] == {
        "time": "2026-12-01T09:00:00Z",
        "username": "alice",
        "teams": "analysts",
        "datasource": "shop",
        "conversation_id": str(audit["a1"].conversation_id),
        "run_id": str(audit["a1"].run_id),
        "kind": "read",
        "statement": "SELECT 'a1'",
        "approved_by": "",
        "approved_via": "",
        "approval_id": "",
        "outcome": "ok",
        "explained": "false",
        "row_count": "1",
        "duration_ms": "3",
    }
    assert rows[0]["outcome"] == "database_error" and rows[0]["row_count"] == ""
    assert rows[0]["explained"] == "true"
    everything = csv_of(admin_client_.get(EXPORT))
    assert [r["username"] for r in everything] == ["mallory", "alice", "alice"]
    selected = admin_client_.post(
        CHANGELIST, {"action": "export_csv", "_selected_action": [audit["m1"].id]}
    )
    assert [r["statement"] for r in csv_of(selected)] == ["SELECT 'm1'"]
    assert admin_client_.get(EXPORT, {"no_such_field": "1"}).status_code == 400


def test_the_export_is_for_staff_only(audit, user):
    client = Client()
    client.force_login(user)
    response = client.get(EXPORT)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
