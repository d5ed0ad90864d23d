"""``GET /api/admin/audit``: staff only, newest first, cursor-paginated, each filter
narrowing the rows, and a bad filter a 400 in the one error shape."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import Group

from tests.audit.records import recorded
from tests.conftest import api_client_for

pytestmark = pytest.mark.django_db

URL = "/api/admin/audit"


@pytest.fixture
def staff(make_user):
    return api_client_for(make_user("root", is_staff=True))


@pytest.fixture
def audit(user, other_user):
    """Five statements: alice's (in analysts) on shop and warehouse over three days, and
    mallory's (in finance); alice leaves analysts after the first two."""
    analysts, finance = Group.objects.create(name="analysts"), Group.objects.create(name="finance")
    user.groups.add(analysts)
    other_user.groups.add(finance)
    rows = {
        "a1": recorded(user, time="2026-12-01T09:00", statement="SELECT 'a1'"),
        "a2": recorded(user, time="2026-12-02T09:00", datasource="warehouse"),
    }
    user.groups.remove(analysts)
    rows["a3"] = recorded(user, time="2026-12-03T09:00")
    rows["m1"] = recorded(other_user, time="2026-12-02T12:00")
    rows["m2"] = recorded(other_user, time="2026-12-03T23:59:59", datasource="warehouse")
    return {"rows": rows, "analysts": analysts, "finance": finance}


def ids(response) -> list[int]:
    assert response.status_code == 200, response.json()
    return [item["id"] for item in response.json()["results"]]


def test_every_statement_newest_first_in_the_documented_shape(staff, audit, user):
    rows = audit["rows"]
    response = staff.get(URL)
    assert ids(response) == [rows[k].id for k in ("m2", "a3", "m1", "a2", "a1")]
    assert set(response.json()) == {"results", "next", "previous"}
    oldest = response.json()["results"][-1]
    assert oldest == {
        "id": rows["a1"].id,
        "time": "2026-12-01T09:00:00Z",
        "user": "alice",
        "user_id": user.pk,
        "teams": [{"id": audit["analysts"].pk, "name": "analysts"}],
        "datasource": "shop",
        "conversation_id": str(rows["a1"].conversation_id),
        "run_id": str(rows["a1"].run_id),
        "statement": "SELECT 'a1'",
        "kind": "read",
        "approved_by": None,
        "approved_via": None,
        "approval_id": None,
        "outcome": "ok",
        "explained": False,
        "row_count": 1,
        "duration_ms": 3,
    }


def test_each_filter_narrows_the_rows(staff, audit, user):
    rows, analysts = audit["rows"], audit["analysts"]

    def of(*keys):
        return [rows[k].id for k in keys]

    assert ids(staff.get(URL, {"user": "alice"})) == of("a3", "a2", "a1")
    assert ids(staff.get(URL, {"user_id": user.pk})) == of("a3", "a2", "a1")
    assert ids(staff.get(URL, {"user": str(user.pk)})) == []  # a username, not an id
    assert ids(staff.get(URL, {"user": "nobody"})) == []
    # The teams as they were: alice left analysts before her third statement.
    assert ids(staff.get(URL, {"team_id": analysts.pk})) == of("a2", "a1")
    assert ids(staff.get(URL, {"team": str(analysts.pk)})) == []  # a name, not an id
    assert ids(staff.get(URL, {"team": "analysts"})) == of("a2", "a1")
    assert ids(staff.get(URL, {"team": "finance"})) == of("m2", "m1")
    assert ids(staff.get(URL, {"datasource": "warehouse"})) == of("m2", "a2")
    assert ids(staff.get(URL, {"since": "2026-12-02T10:00:00Z"})) == of("m2", "a3", "m1")
    # A date alone: from its start (since), to its end (until), UTC.
    assert ids(staff.get(URL, {"since": "2026-12-03"})) == of("m2", "a3")
    assert ids(staff.get(URL, {"until": "2026-12-02"})) == of("m1", "a2", "a1")
    assert ids(staff.get(URL, {"since": "2026-12-03", "until": "2026-12-03"})) == of("m2", "a3")
    assert ids(staff.get(URL, {"until": "2026-12-02T09:00:00+00:00"})) == of("a2", "a1")
    both = {"user": "mallory", "datasource": "warehouse", "since": "2026-12-02"}
    assert ids(staff.get(URL, both)) == of("m2")


def test_pages_follow_next_without_overlap(staff, audit):
    rows = audit["rows"]
    seen, url, pages = [], f"{URL}?page_size=2", 0
    while url:
        page = staff.get(url)
        seen += ids(page)
        url, pages = page.json()["next"], pages + 1
    assert pages == 3
    assert seen == [rows[k].id for k in ("m2", "a3", "m1", "a2", "a1")]
    filtered = staff.get(URL, {"user": "alice", "page_size": 1}).json()
    assert [r["user"] for r in filtered["results"]] == ["alice"]
    assert "user=alice" in filtered["next"]
    assert ids(staff.get(filtered["next"])) == [rows["a2"].id]


@pytest.mark.parametrize(
    ("query", "code", "field"),
    [
        ({"since": "yesterday"}, "invalid", "since"),
        ({"until": "2026-13-01"}, "invalid", "until"),
        ({"usr": "alice"}, "unknown_field", "usr"),
        ({"user": "x" * 151}, "max_length", "user"),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(staff, audit, query, code, field):
    response = staff.get(URL, query)
    assert response.status_code == 400
    body = response.json()
    assert body["code"] == code and body["detail"]
    assert field in body["fields"]


def test_since_after_until_is_invalid_range(staff, audit):
    response = staff.get(URL, {"since": "2026-12-03", "until": "2026-12-01"})
    assert response.status_code == 400
    assert response.json() == {"detail": "`since` is after `until`.", "code": "invalid_range"}


def test_only_staff_read_the_audit(api, audit):
    assert api.get(URL).status_code == 403
    assert api_client_for(None).get(URL).status_code == 401


@pytest.mark.parametrize(
    "query",
    [
        {"team": "9" * 30},
        {"user": "9" * 30},
        {"team": "²"},
        {"user": "٣"},
        {"datasource": "x" * 100},
    ],
)
def test_an_id_out_of_range_or_not_ascii_matches_nothing(staff, audit, query):
    assert ids(staff.get(URL, query)) == []


def test_a_team_is_found_by_its_name_ignoring_case_digits_too(staff, user):
    digits = Group.objects.create(name="2024")
    equipe = Group.objects.create(name="Équipe")
    user.groups.add(digits, equipe)
    row = recorded(user, time="2026-12-04T09:00")
    for name in ("2024", "ÉQUIPE", "équipe", "E\u0301quipe", " Équipe "):
        assert ids(staff.get(URL, {"team": name})) == [row.id], name
    assert ids(staff.get(URL, {"team_id": digits.pk})) == [row.id]
    assert ids(staff.get(URL, {"team": "202"})) == []


def test_user_and_team_ids_are_ids_only(staff, audit, user):
    assert ids(staff.get(URL, {"user": "alice", "user_id": user.pk + 1000})) == []
    for query in (
        {"user_id": "alice"},
        {"user_id": "٣"},
        {"user_id": str(2**63)},
        {"user_id": "0"},
        {"team_id": "analysts"},
        {"team_id": "²"},
        {"team_id": str(2**31)},
        {"team_id": "-1"},
    ):
        response = staff.get(URL, query)
        assert response.status_code == 400, query
        assert response.json()["detail"] and list(query) == list(response.json()["fields"]), query


@pytest.mark.parametrize("cursor", ["abc", "!!!", "cD0yMDI2"])
def test_a_cursor_not_from_next_is_invalid_cursor(staff, audit, cursor):
    response = staff.get(URL, {"cursor": cursor})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_cursor" and response.json()["detail"]


@pytest.mark.parametrize("page_size", ["-1", "0", "abc", "101", "1.5", "٣", ""])
def test_a_page_size_out_of_1_to_100_is_invalid_page_size(staff, audit, page_size):
    response = staff.get(URL, {"page_size": page_size})
    assert response.status_code == 400
    assert response.json()["code"] == "invalid_page_size" and response.json()["detail"]
    assert len(ids(staff.get(URL, {"page_size": "100"}))) == 5
    assert len(ids(staff.get(URL, {"page_size": "1"}))) == 1
