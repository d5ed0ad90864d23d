"""Datasource access through paw-client against a real PAW stack (issue 27, part 2): the
client's listing and detail, a run and an SQL question naming a datasource the person may
not use, the ``paw`` command and the ``%%agent`` magic — all through the API, refused as
an unknown datasource is; and allowed once the person joins the team."""

from __future__ import annotations

import nbformat
import pytest

from conversations.models import Conversation
from paw_client import Client, InvalidRequest, NotFound
from teams.models import Access, Team
from tests.clients.test_cli import paw
from tests.clients.test_magic import execute, texts
from tests.factories import datasource_made

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def finance(tmp_path):
    """``finance`` (a real SQLite file) for team *analysts* only, and ``open`` for all."""
    path = tmp_path / "finance.sqlite3"
    import sqlite3

    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE ledger (id INTEGER PRIMARY KEY, total REAL)")
    team = Team.objects.create(name="analysts")
    for slug, access, teams in (
        ("finance", Access.TEAMS, [team.pk]),
        ("open", Access.EVERYONE, []),
    ):
        datasource_made(
            slug=slug, name=slug.title(), dialect="sqlite", connection={"database": str(path)},
            access=access, teams=teams,
        )  # fmt: skip
    return team


def test_the_client_sees_and_uses_only_what_its_person_may(stack, person, finance):
    with Client(stack.base, token=person.token) as client:
        assert [d.slug for d in client.datasources()] == ["open"]
        with pytest.raises(NotFound):
            client.datasource("finance")
        conversation = client.new_conversation(title="Money")
        with pytest.raises(InvalidRequest) as refused:
            conversation.ask("totals?", datasources=["finance"])
        assert refused.value.code == "unknown_datasource" and "finance" in str(refused.value)
        with pytest.raises(InvalidRequest) as question:
            client.sql_ask("finance", "Totals?")
        assert question.value.code == "unknown_datasource"
        with pytest.raises(InvalidRequest):
            conversation.update(datasources=["finance"])
        finance.user_set.add(person.user)  # ada joins the team
        assert [d.slug for d in client.datasources()] == ["finance", "open"]
        assert client.datasource("finance")["slug"] == "finance"
        assert conversation.update(datasources=["finance"]).datasources == ["finance"]


def test_the_command_and_the_magic_are_refused_a_datasource_like_an_unknown_one(
    stack, person, finance, tmp_path, monkeypatch
):
    code, out, err = paw(
        "ask", "hi", "--datasource", "finance", stack=stack, home=tmp_path, token=person.token
    )
    assert code == 3 and "unknown_datasource" in err and "finance" in err and out == ""
    assert not Conversation.objects.filter(user=person.user).exists()  # none left behind

    monkeypatch.setenv("PAW_TOKEN", person.token)
    cells = [
        "%load_ext paw_client",
        f"%paw_connect {stack.base}",
        "%%agent --datasource finance\nhi",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    execute(nb, [], [], tmp_path)
    [output] = nb.cells[2].outputs
    assert output.output_type == "stream" and output.name == "stderr"
    assert texts(output).startswith("PAW: unknown_datasource: ") and "finance" in texts(output)
