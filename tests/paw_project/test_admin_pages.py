"""The admin as operators see it (Django's test client, signed in as a superuser): help
texts shown as written, approvals listed with their prompt and conversation, add forms
without the times a new object has not got, the usage ledger's columns."""

from __future__ import annotations

import re

import pytest
from django.test import Client

from conversations.models import Run
from conversations.services.approvals import approval_create
from secrets_vault.models import Datasource
from tests.billing.ledger import ledger_event
from tests.factories import ConversationFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(make_user) -> Client:
    client = Client()
    client.force_login(make_user("operator", is_staff=True, is_superuser=True))
    return client


def page(client: Client, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, path
    return response.content.decode()


def labels(html: str) -> set[str]:
    """The field labels of an admin form (editable and read-only ones)."""
    found = re.findall(r"<label[^>]*>([^<:]+):?</label>", html)
    return {label.strip() for label in found}


def test_the_datasource_help_text_shows_the_variable_name_escaped(operator):
    html = page(operator, "/admin/secrets_vault/datasource/add/")
    assert "PAW_DATASOURCE_&lt;SLUG&gt;_URL" in html
    assert "PAW_DATASOURCE__URL" not in re.sub(r"<[^>]+>", "", html)  # nothing vanished


def test_add_forms_leave_out_created_and_updated_times_change_forms_show_them(operator):
    add = labels(page(operator, "/admin/secrets_vault/datasource/add/"))
    assert "Slug" in add and "Connection" in add
    assert not {"Created at", "Updated at", "Schema refreshed at", "Sandbox variable"} & add
    datasource = Datasource.objects.create(
        slug="warehouse", name="Warehouse", dialect="sqlite", connection={"database": "x.db"}
    )
    change = labels(page(operator, f"/admin/secrets_vault/datasource/{datasource.pk}/change/"))
    assert {"Created at", "Updated at", "Sandbox variable"} <= change
    for path in ("/admin/secrets_vault/secret/add/", "/admin/conversations/conversation/add/"):
        add = labels(page(operator, path))
        assert add and not {"Created at", "Updated at", "Last used at"} & add, (path, add)


def test_the_approvals_list_shows_the_prompt_and_the_conversation(operator):
    conversation = ConversationFactory(title="Quarterly tips")
    run = Run.objects.create(conversation=conversation, user=conversation.user, prompt="p")
    approval_create(
        run=run,
        data={
            "kind": "confirm",
            "prompt": "Delete summary.xlsx?\nIt goes for good.",
            "ask_id": "a",
        },
    )
    html = page(operator, "/admin/conversations/approval/")
    headers = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', html)
    assert headers[:4] == ["id", "conversation", "prompt_text", "kind"], headers
    assert "Delete summary.xlsx? It goes for good." in html  # one line
    assert "Quarterly tips" in html


def test_the_usage_ledger_list_has_its_columns_and_demo_flag_in_a_scrolling_box(operator, user):
    ledger_event(user=user, input_tokens=10, provider="demo", demo=True)
    html = page(operator, "/admin/billing/usageevent/")
    headers = re.findall(r'<th scope="col" class="[^"]*column-(\w+)', html)
    assert headers[-3:] == ["rounds", "estimated", "demo"], headers
    assert re.search(r'<div class="results">\s*<table id="result_list">', html)
