"""paw-agent's side of datasource knowledge and of SQL questions: a submit's ``knowledge``
(the entries shown to the model, the index files PAW wrote for ``search_knowledge``, hybrid
with the scripted model's embeddings), a submit's ``tools`` (the only tools offered, any
other refused without acting or being announced), and ``run_sql``'s ``sql_result``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from django.utils import timezone

from secrets_vault.embeddings import Embedder
from secrets_vault.models import Datasource, KnowledgeEntry
from secrets_vault.services.knowledge import (
    IndexSource,
    knowledge_embed_missing,
    knowledge_index_write,
)
from tests.paw_agent.conftest import API_KEY
from tests.paw_agent.driver import notifies
from tests.paw_agent.test_sql import datasource_env, script, sql_call, tool_results

FOLDER = ".paw/host/knowledge"
SQL_TOOLS = ["run_sql", "search_knowledge", "ask_user"]


@pytest.fixture
def shop_sqlite(tmp_path: Path) -> Path:
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE passengers (id INTEGER PRIMARY KEY, survived INT)")
        connection.executemany("INSERT INTO passengers (survived) VALUES (?)", [(1,), (0,), (1,)])
    return path


def shop_knowledge() -> Datasource:
    """A datasource ``shop`` with three entries: two tables and a doc."""
    datasource = Datasource.objects.create(slug="shop", name="The shop", dialect="sqlite")
    KnowledgeEntry.objects.bulk_create(
        [
            KnowledgeEntry(
                datasource=datasource, kind="schema", title="passengers",
                text="Table passengers (2 columns): who was aboard.\nColumns:\n- id integer\n"
                "- survived integer: 1 when the person survived",
            ),
            KnowledgeEntry(
                datasource=datasource, kind="schema", title="cabins",
                text="Table cabins (2 columns): deck and number of each cabin.",
            ),
            KnowledgeEntry(
                datasource=datasource, kind="doc", title="Fares",
                text="Fares are in pounds sterling of 1912.",
            ),
        ]
    )  # fmt: skip
    return datasource


def knowledge_op(workspace: Path, datasource: Datasource, *, vector_model: str = "") -> dict:
    """A submit's ``knowledge``: one doc, and the datasource's index file written by PAW
    into the workspace's ``.paw/host/knowledge``."""
    datasource.refresh_from_db()
    source = IndexSource(
        datasource_id=datasource.pk, slug="shop", version=datasource.knowledge_version
    )
    folder = workspace / FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    knowledge_index_write(source=source, path=folder / source.file_name, vector_model=vector_model)
    entry = {
        "datasource": "shop",
        "kind": "doc",
        "title": "Fares",
        "text": "Fares are in pounds.",
        "sql": "",
    }
    return {
        "entries": [entry],
        "indexes": [{"datasource": "shop", "path": f"{FOLDER}/{source.file_name}"}],
    }


def search(query: str, **more) -> dict:
    return {"tool_calls": [{"name": "search_knowledge", "arguments": {"query": query, **more}}]}


@pytest.mark.django_db
def test_a_runs_knowledge_reaches_the_model_and_search_knowledge_finds_more(
    start, model, workspace, shop_sqlite
):
    knowledge = knowledge_op(workspace, shop_knowledge())
    model.load(
        script(search("who survived"), search("deck", kind="doc"), search("x", datasource="nope"))
    )
    runtime = start("paw-agent", env=datasource_env("shop", "sqlite", f"sqlite:///{shop_sqlite}"))
    runtime.ready()
    lines = runtime.submit("How many survived?", knowledge=knowledge)
    first = model.requests[0]
    system = [m["content"] for m in first["messages"] if m["role"] == "system"]
    assert "[doc] Fares (datasource shop)\nFares are in pounds." in system[1]
    assert "search_knowledge" in [t["function"]["name"] for t in first["tools"]]
    found, none, wrong = tool_results(model)
    assert found.startswith("[schema] passengers (datasource shop)\nTable passengers")
    assert "cabins" not in found  # the words did not match it
    assert none == "nothing found; try other words"
    assert wrong == "error: no knowledge of datasource 'nope'; there is: shop"
    assert [t["ok"] for t in notifies(lines, "tool")] == [True, True, False]
    # The host's lineage reads which entries a search found (ids of the index, PAW's).
    passengers = KnowledgeEntry.objects.get(title="passengers")
    assert notifies(lines, "tool")[0]["entries"] == [
        {"id": passengers.pk, "datasource": "shop", "kind": "schema", "title": "passengers"}
    ]
    assert "entries" not in notifies(lines, "tool")[1]  # nothing found
    # The knowledge is this run's: the next run without it neither sees nor offers it.
    model.load(script())
    runtime.submit("And now?", run_id="run-2")
    later = model.requests[-1]
    assert all("Fares are in pounds" not in str(m["content"]) for m in later["messages"])
    assert "search_knowledge" not in [t["function"]["name"] for t in later["tools"]]


@pytest.mark.django_db
def test_search_knowledge_is_hybrid_with_the_scripted_embeddings(start, model, workspace):
    """ "survivors" and "survived" have different stems (porter: survivor, surviv), so
    full-text alone finds nothing; their shared trigrams make the scripted vectors close."""
    datasource = shop_knowledge()
    embedder = Embedder(
        provider="test", base_url=model.base_url, model="scripted-embedding", api_key=API_KEY
    )
    assert knowledge_embed_missing(datasource_ids=[datasource.pk], embedder=embedder) == 3
    datasource.refresh_from_db()
    knowledge = knowledge_op(workspace, datasource, vector_model="scripted-embedding")
    model.load(script(search("survivors")))
    plain = start("paw-agent")
    plain.ready()
    plain.submit("who made it", knowledge=knowledge)
    [alone] = tool_results(model)
    assert alone == "nothing found; try other words"
    model.load(script(search("survivors")))
    hybrid = start(
        "paw-agent",
        env={
            "PAW_EMBEDDING_BASE_URL": model.base_url,
            "PAW_EMBEDDING_MODEL": "scripted-embedding",
            "PAW_EMBEDDING_API_KEY": API_KEY,
        },
    )
    hybrid.ready()
    hybrid.submit("who made it", knowledge=knowledge)
    [found] = tool_results(model)
    assert found.startswith("[schema] passengers (datasource shop)"), found
    assert model.embedding_requests[-1]["input"] == ["survivors"]


@pytest.mark.django_db
def test_verified_examples_come_first_in_search_knowledge_and_are_labelled(
    start, model, workspace
):
    """Two examples match "survived"; the one full-text ranks second (fewer of the words)
    is verified: it comes first, labelled, in the tool's result and in the prompt's."""
    datasource = shop_knowledge()
    KnowledgeEntry.objects.bulk_create(
        [
            KnowledgeEntry(
                datasource=datasource, kind="example", title="How many survived, survived?",
                sql="SELECT count(*) FROM passengers WHERE survived = 1",
            ),
            KnowledgeEntry(
                datasource=datasource, kind="example", title="Share that survived",
                sql="SELECT avg(survived) FROM passengers", verified_at=timezone.now(),
            ),
        ]
    )  # fmt: skip
    knowledge = knowledge_op(workspace, datasource)
    knowledge["entries"].append(
        {
            "datasource": "shop",
            "kind": "example",
            "title": "Share that survived",
            "text": "",
            "sql": "SELECT avg(survived) FROM passengers",
            "verified": True,
        }
    )
    model.load(script(search("how many survived", kind="example")))
    runtime = start("paw-agent")
    runtime.ready()
    runtime.submit("How many survived?", knowledge=knowledge)
    [found] = tool_results(model)
    first, second = found.split("\n\n")
    assert first.startswith("[example, verified] Share that survived (datasource shop)"), found
    assert second.startswith("[example] How many survived, survived? (datasource shop)"), found
    system = [m["content"] for m in model.requests[0]["messages"] if m["role"] == "system"]
    assert "[example, verified] Share that survived (datasource shop)" in system[1]
    assert "An example marked verified was checked by a person" in system[1]


def test_a_knowledge_index_outside_the_workspace_is_refused(start, workspace, tmp_path):
    runtime = start("paw-agent")
    runtime.ready()
    outside = {"entries": [], "indexes": [{"datasource": "x", "path": "../elsewhere.sqlite3"}]}
    runtime.send(
        {"op": "submit", "prompt": "hi", "run_id": "r1", "knowledge": outside, "op_id": "s1"}
    )
    error = runtime.error()
    assert error["op_id"] == "s1"
    assert "outside the workspace" in error["error"]["message"]
    runtime.send(
        {"op": "submit", "prompt": "hi", "run_id": "r1", "tools": "run_sql", "op_id": "s2"}
    )
    assert runtime.error()["error"]["message"] == "submit's tools must be a list of tool names"


def test_a_run_restricted_to_sql_tools_is_offered_only_those_and_refuses_others(
    start, model, shop_sqlite
):
    code = {"name": "run_python", "arguments": {"code": "open('escaped.txt', 'w')"}}
    model.load(script({"tool_calls": [code]}, sql_call("SELECT survived FROM passengers")))
    runtime = start(
        "paw-agent",
        "--sql-result-rows",
        "2",
        env=datasource_env("shop", "sqlite", f"sqlite:///{shop_sqlite}"),
    )
    runtime.ready()
    lines = runtime.submit("How many survived?", tools=SQL_TOOLS)
    offered = [t["function"]["name"] for t in model.requests[0]["tools"]]
    assert offered == ["run_sql", "ask_user"]  # no knowledge was given: no search_knowledge
    assert (
        "answering a question about a database with SQL"
        in model.requests[0]["messages"][0]["content"]
    )
    refused, rows = tool_results(model)
    assert refused.startswith("error: unknown tool 'run_python'; the tools are: run_sql, ask_user")
    assert not (Path(runtime.process.args[3]) / "escaped.txt").exists()
    # The refused call is never announced: a host stops runs that call tools they may not.
    assert [call["name"] for calls in notifies(lines, "tool_calls") for call in calls] == [
        "run_sql"
    ]
    run_sql = notifies(lines, "tool")[-1]
    assert run_sql["sql_result"] == {
        "datasource": "shop",
        "sql": "SELECT survived FROM passengers",
        "columns": ["survived"],
        "rows": [[1], [0]],
        "row_count": 3,
        "truncated": True,
    }
    assert rows.endswith("(3 rows)")
    assert json.loads(json.dumps(run_sql)) == run_sql
