"""Operators' writes over the REST API (``/api/admin/...``) land in Django's admin log
(``LogEntry``), where the admin records its own: who, what, which object, and never a
value."""

from __future__ import annotations

import sqlite3

import pytest
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.test import Client

from secrets_vault.models import Datasource, KnowledgeEntry, Secret
from tests.conftest import api_client_for
from tests.secrets_vault.conftest import secret_value

pytestmark = pytest.mark.django_db


@pytest.fixture
def root(make_user):
    return make_user("root", is_staff=True)


def entries() -> list[tuple[str, str, int, str]]:
    """The admin log, oldest first: ``(model, object_id, action_flag, message)``."""
    return [
        (e.content_type.model, e.object_id, e.action_flag, e.change_message)
        for e in LogEntry.objects.order_by("action_time", "id").select_related("content_type")
    ]


def test_secret_writes_over_rest_are_in_the_admin_log(root):
    staff = api_client_for(root)
    value, new_value = secret_value("op-secret"), secret_value("op-secret-2")
    created = staff.post(
        "/api/admin/secrets", {"name": "OPS_KEY", "value": value}, format="json"
    ).json()
    path = f"/api/admin/secrets/{created['id']}"
    changed = staff.patch(path, {"value": new_value, "description": "rotated"}, format="json")
    assert changed.status_code == 200
    assert staff.delete(path).status_code == 204
    sid = str(created["id"])
    assert entries() == [
        ("secret", sid, ADDITION, "Added over the REST API (POST /api/admin/secrets)."),
        ("secret", sid, CHANGE, f"Changed description, value over the REST API (PATCH {path})."),
        ("secret", sid, DELETION, f"Deleted over the REST API (DELETE {path})."),
    ]
    assert {e.user_id for e in LogEntry.objects.all()} == {root.pk}
    assert LogEntry.objects.order_by("id").first().object_repr.startswith("OPS_KEY")
    log = " ".join(e.change_message + e.object_repr for e in LogEntry.objects.all())
    assert value not in log and new_value not in log
    assert not Secret.objects.filter(name="OPS_KEY").exists()


def test_datasource_and_knowledge_writes_over_rest_are_in_the_admin_log(root, tmp_path):
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
    staff = api_client_for(root)
    created = staff.post(
        "/api/admin/datasources",
        {
            "slug": "shop",
            "name": "Shop",
            "dialect": "sqlite",
            "connection": {"database": str(path)},
        },
        format="json",
    )
    assert created.status_code == 201, created.json()
    base = "/api/admin/datasources/shop"
    assert staff.patch(base, {"description": "Orders"}, format="json").status_code == 200
    entry = staff.post(
        f"{base}/knowledge",
        {"kind": "example", "title": "How many orders?", "sql": "SELECT count(*) FROM orders"},
        format="json",
    )
    assert entry.status_code == 201, entry.json()
    entry_path = f"{base}/knowledge/{entry.json()['id']}"
    assert staff.patch(entry_path, {"title": "Orders?"}, format="json").status_code == 200
    assert staff.delete(entry_path).status_code == 204
    assert staff.post(f"{base}/refresh-schema").status_code == 202
    datasource_id = str(Datasource.objects.get(slug="shop").pk)
    assert staff.delete(base).status_code == 204
    eid = str(entry.json()["id"])
    assert entries() == [
        ("datasource", datasource_id, ADDITION, "Added over the REST API (POST /api/admin/datasources)."),
        ("datasource", datasource_id, CHANGE, f"Changed description over the REST API (PATCH {base})."),
        ("knowledgeentry", eid, ADDITION, f"Added over the REST API (POST {base}/knowledge)."),
        ("knowledgeentry", eid, CHANGE, f"Changed title over the REST API (PATCH {entry_path})."),
        ("knowledgeentry", eid, DELETION, f"Deleted over the REST API (DELETE {entry_path})."),
        ("datasource", datasource_id, CHANGE,
         f"Changed: schema refresh requested over the REST API (POST {base}/refresh-schema)."),
        ("datasource", datasource_id, DELETION, f"Deleted over the REST API (DELETE {base})."),
    ]  # fmt: skip
    assert not KnowledgeEntry.objects.exists()


def test_a_refused_write_logs_nothing(root, api):
    staff = api_client_for(root)
    refused = staff.post(
        "/api/admin/datasources",
        {"slug": "bad", "name": "Bad", "dialect": "postgresql",
         "connection": {"host": "db", "password": "literal"}},
        format="json",
    )  # fmt: skip
    assert refused.status_code == 400
    assert (
        api.post("/api/admin/secrets", {"name": "X", "value": "y"}, format="json").status_code
        == 403
    )
    assert LogEntry.objects.count() == 0


def test_the_admins_refresh_schema_action_is_in_the_admin_log(make_user, tmp_path):
    path = tmp_path / "shop.sqlite3"
    sqlite3.connect(path).close()
    datasource = Datasource.objects.create(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(path)}
    )
    client = Client()
    root = make_user("boss", is_staff=True, is_superuser=True)
    client.force_login(root)
    response = client.post(
        "/admin/secrets_vault/datasource/",
        {"action": "refresh_schema", "_selected_action": [datasource.pk]},
    )
    assert response.status_code == 302
    [entry] = LogEntry.objects.all()
    assert (entry.user_id, entry.object_id, entry.action_flag, entry.change_message) == (
        root.pk, str(datasource.pk), CHANGE, "Schema refresh requested.",
    )  # fmt: skip


def test_team_writes_over_rest_are_in_the_admin_log(root, user):
    staff = api_client_for(root)
    created = staff.post(
        "/api/admin/teams", {"name": "analysts", "members": ["alice"]}, format="json"
    )
    assert created.status_code == 201, created.json()
    path = f"/api/admin/teams/{created.json()['id']}"
    assert (
        staff.patch(path, {"name": "analysts-eu", "members": []}, format="json").status_code == 200
    )
    assert staff.delete(path).status_code == 204
    tid = str(created.json()["id"])
    assert entries() == [
        ("team", tid, ADDITION, "Added over the REST API (POST /api/admin/teams)."),
        ("team", tid, CHANGE, f"Changed members, name over the REST API (PATCH {path})."),
        ("team", tid, DELETION, f"Deleted over the REST API (DELETE {path})."),
    ]
    assert [e.object_repr for e in LogEntry.objects.order_by("id")] == [
        "analysts", "analysts-eu", "analysts-eu",
    ]  # fmt: skip
