"""What a run takes into its sandbox beside its prompt, through the real worker and
runtimes: the model limits (``PAW_MODEL_MAX_*``) in each runtime's own way, memory
counted as the seed counts it, a conversation's approval timeout, its datasources'
knowledge (in the model request, searchable, read-only in the jail, hybrid with the
scripted embeddings), and a tool restriction both enforced and checked by PAW."""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
from datetime import timedelta

import pytest

from conversations.models import Approval, Run, RunEvent
from conversations.services.runs import SQL_TOOLS, run_start
from conversations.services.workspaces import workspace_ensure
from sandboxes.models import Sandbox
from secrets_vault.models import KnowledgeEntry
from secrets_vault.services.knowledge import datasource_schema_refresh, knowledge_entry_create
from tests.conftest import HARNESS, PAW_AGENT, SCRIPTED_API_KEY
from tests.factories import ConversationFactory, datasource_made
from tests.live import wait_for
from tests.sandboxes.observe import finished, process_command_line, process_environment
from tests.sandboxes.scenarios import FAKE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def run_to_end(conversation, prompt: str, **fields) -> Run:
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt=prompt, **fields
    )
    return wait_for(lambda: finished(run.id), timeout=90, what=f"the run {prompt!r} to end")


def searching(prompt: str, query: str, *more: dict) -> dict:
    """A script answering ``prompt`` with a ``search_knowledge`` call for ``query``, then
    ``more`` steps, then "Done."."""
    steps = [{"tool_calls": [{"name": "search_knowledge", "arguments": {"query": query}}]}]
    return {
        "api_key": SCRIPTED_API_KEY,
        "untooled": "Title",
        "rules": [{"match": re.escape(prompt), "responses": [*steps, *more, {"text": "Done."}]}],
    }


def sandbox_command(conversation) -> str:
    """The whole command line of the conversation's live sandbox process."""
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    return " ".join(process_command_line(sandbox.pid))


def request_of(scripted_model, prompt: str) -> dict:
    """The latest agent request (one offering tools: not a title) whose last user message
    is ``prompt``."""
    for body in reversed(scripted_model.requests):
        users = [m for m in body.get("messages", []) if m.get("role") == "user"]
        if not body.get("tools"):
            continue
        if users and users[-1]["content"] == prompt:
            return body
    raise AssertionError(f"the model never saw {prompt!r}")


@pytest.mark.parametrize("runtime", [PAW_AGENT, HARNESS])
def test_the_model_limits_reach_both_runtimes(worker_node, scripted_model, runtime):
    worker_node.use(
        runtime, PAW_MODEL_MAX_OUTPUT_TOKENS="1234", PAW_MODEL_MAX_CONTEXT_TOKENS="50000"
    )
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Fine."})
    conversation = ConversationFactory()
    assert run_to_end(conversation, "Limits?").status == Run.Status.DONE
    assert request_of(scripted_model, "Limits?")["max_tokens"] == 1234
    command = sandbox_command(conversation)
    if runtime == PAW_AGENT:
        assert "--max-output-tokens 1234 --context-budget 50000 --memory-turns 6" in command
    else:
        config = re.search(r"--config (\S+)", command).group(1)
        with open(config) as handle:
            assert json.load(handle) == {
                "llm": {"max_tokens": 1234},
                "context_windows": {"scripted-model": 50000},
            }


def test_memory_is_twelve_turns_six_exchanges_resident_and_after_a_respawn(
    celery_worker, scripted_model
):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Noted."})
    conversation = ConversationFactory()
    for n in range(1, 9):
        assert run_to_end(conversation, f"fact {n}").status == Run.Status.DONE

    def remembered(prompt: str) -> list[str]:
        body = request_of(scripted_model, prompt)
        return [m["content"] for m in body["messages"] if m["role"] == "user"][:-1]

    assert run_to_end(conversation, "what do you know?").status == Run.Status.DONE
    assert remembered("what do you know?") == [f"fact {n}" for n in range(3, 9)]
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    os.kill(sandbox.pid, signal.SIGKILL)
    wait_for(
        lambda: Sandbox.objects.filter(id=sandbox.id, state__in=Sandbox.LIVE_STATES).count() == 0
    )
    assert run_to_end(conversation, "and now?").status == Run.Status.DONE
    # The new process was seeded with the last six exchanges (the first of them: "fact 4").
    assert remembered("and now?") == [*(f"fact {n}" for n in range(4, 9)), "what do you know?"]


def test_a_conversations_approval_timeout_sets_its_deadlines(celery_worker, scripted_model):
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "responses": [
                {"tool_calls": [{"name": "delete_file", "arguments": {"path": "x.txt"}}]}
            ],
            "fallback": "Done.",
        }
    )
    conversation = ConversationFactory(approval_timeout_seconds=15)
    (workspace_ensure(conversation.id) / "x.txt").write_text("x")
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt="Delete x.txt")
    approval = wait_for(lambda: Approval.objects.filter(run=run).first(), what="the confirm")
    assert approval.expires_at - approval.created_at == timedelta(seconds=15)
    command = sandbox_command(conversation)
    assert "--answer-timeout 75" in command  # the runtime's backstop: the conversation's + 60
    run = wait_for(lambda: finished(run.id), timeout=60, what="the confirm to expire")
    approval.refresh_from_db()
    assert approval.status == Approval.Status.EXPIRED and approval.decided_by == "timeout"
    assert (workspace_ensure(conversation.id) / "x.txt").exists()


@pytest.fixture
def shop_file(tmp_path):
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE penguins (id INTEGER PRIMARY KEY, species TEXT, flipper_mm REAL)")
        db.execute("CREATE TABLE taxi_trips (id INTEGER PRIMARY KEY, fare REAL, tip REAL)")
        db.executemany(
            "INSERT INTO penguins (species, flipper_mm) VALUES (?, ?)", [("Adelie", 181.0)]
        )
    return path


def test_a_runs_knowledge_is_in_the_model_request_searchable_and_read_only_in_the_jail(
    api, celery_worker, scripted_model, shop_file, user
):
    datasource = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )
    assert datasource_schema_refresh(datasource_id=datasource.pk, user=None) == 2
    doc = knowledge_entry_create(
        datasource=datasource,
        kind="doc",
        title="Flippers",
        text="Flipper lengths are in cm.",
        user=None,
    )
    user.is_staff = True
    user.save()
    edited = api.patch(
        f"/api/admin/datasources/shop/knowledge/{doc.pk}",
        {"text": "Flipper lengths are in mm."},
        format="json",
    )
    assert edited.status_code == 200, edited.json()
    prompt = "How long are the penguins' flippers?"
    escape = "open('.paw/host/knowledge/mine.txt', 'w').write('x')"
    run_python = {"tool_calls": [{"name": "run_python", "arguments": {"code": escape}}]}
    scripted_model.load(searching(prompt, "taxi fares", run_python))
    conversation = ConversationFactory(user=user)
    assert run_to_end(conversation, prompt, datasources=["shop"]).status == Run.Status.DONE
    first = next(
        body for body in scripted_model.requests
        if [m for m in body["messages"] if m["role"] == "user"][-1]["content"] == prompt
    )  # fmt: skip
    context = "\n".join(m["content"] for m in first["messages"] if m["role"] == "system")
    assert (
        "[schema] penguins (datasource shop)\nTable penguins (3 columns, about 1 rows)." in context
    )
    assert "- flipper_mm REAL" in context
    assert "[doc] Flippers (datasource shop)\nFlipper lengths are in mm." in context  # the edit
    assert "search_knowledge" in [t["function"]["name"] for t in first["tools"]]
    results = [
        m["content"] for m in request_of(scripted_model, prompt)["messages"] if m["role"] == "tool"
    ]
    assert results[0].startswith("[schema] taxi_trips (datasource shop)")
    assert "Read-only file system" in results[1], results[1]
    version = datasource.__class__.objects.get(pk=datasource.pk).knowledge_version
    index = workspace_ensure(conversation.id) / ".paw/host/knowledge" / f"shop.v{version}.sqlite3"
    assert index.is_file() and not (index.parent / "mine.txt").exists()


def test_retrieval_and_search_knowledge_are_hybrid_with_the_scripted_embeddings(
    worker_node, scripted_model, shop_file
):
    worker_node.use(
        PAW_AGENT, PAW_EMBEDDING_PROVIDER="default", PAW_EMBEDDING_MODEL="scripted-embedding"
    )
    datasource = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )
    datasource_schema_refresh(datasource_id=datasource.pk, user=None)
    prompt = "Which penguin has the longest flipper?"
    scripted_model.load(searching(prompt, "tipping"))
    conversation = ConversationFactory()
    assert run_to_end(conversation, prompt, datasources=["shop"]).status == Run.Status.DONE
    asked = [request["input"] for request in scripted_model.embedding_requests]
    assert [prompt] in asked  # the worker embedded the prompt for the run's selection
    assert ["tipping"] in asked  # the sandbox embedded the agent's query
    assert (
        KnowledgeEntry.objects.filter(
            datasource=datasource, vector_model="scripted-embedding"
        ).count()
        == 2
    )
    [found] = [
        m["content"] for m in request_of(scripted_model, prompt)["messages"] if m["role"] == "tool"
    ]
    # "tipping" stems to "tip" and matches the column; the vectors agree.
    assert found.startswith("[schema] taxi_trips (datasource shop)")
    # The embedding key came through the secrets pipe: not in the environment its tools see.
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    assert SCRIPTED_API_KEY not in json.dumps(process_environment(sandbox.pid))


def test_a_runtime_calling_a_tool_its_run_may_not_use_is_stopped(worker_node):
    worker_node.use(FAKE, PAW_SANDBOX_ISOLATION="none", PAW_SANDBOX_READY_TIMEOUT="3")
    conversation = ConversationFactory()
    (workspace_ensure(conversation.id) / "fake_mode").write_text("overstep")
    run = run_to_end(conversation, "Only SQL, please.", kind=Run.Kind.SQL, tools=SQL_TOOLS)
    assert run.status == Run.Status.ERROR
    assert run.errors[0]["code"] == "policy_violation"
    assert "run_python, which this run may not use" in run.errors[0]["message"]
    # The fake runtime is ungated (no approval_gate): the call ran before PAW heard of it.
    assert "the call ran without asking" in run.errors[0]["message"]
    assert "stopped" not in run.errors[0]["message"]
    violation = RunEvent.objects.get(run=run, type="policy_violation")
    assert violation.kind == "tool_not_allowed" and violation.payload["tools"] == ["run_python"]


def test_a_restricted_run_fails_clearly_on_a_runtime_that_cannot_restrict_tools(
    worker_node, scripted_model
):
    worker_node.use(HARNESS)
    conversation = ConversationFactory()
    run = run_to_end(conversation, "Only SQL, please.", kind=Run.Kind.SQL, tools=SQL_TOOLS)
    assert run.status == Run.Status.ERROR
    assert run.errors[0]["code"] == "runtime_unsupported"
    assert "use paw-agent" in run.errors[0]["message"]


def test_a_run_on_a_datasource_with_the_local_embedding_model(
    worker_node, scripted_model, shop_file
):
    """The bundled model embeds on the worker; the sandbox, which has no model, gets no
    embedding endpoint and its search_knowledge is full-text."""
    pytest.importorskip("wordllama", reason="the embeddings-light extra is not installed")
    worker_node.use(
        PAW_AGENT,
        PAW_EMBEDDING_PROVIDER="local",
        PAW_EMBEDDING_MODEL="wordllama-l2-supercat-256",
    )
    datasource = datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(shop_file)}
    )
    datasource_schema_refresh(datasource_id=datasource.pk, user=None)
    prompt = "Which island has the heaviest penguins, by the local model?"
    scripted_model.load(searching(prompt, "tips by taxi"))
    conversation = ConversationFactory()
    assert run_to_end(conversation, prompt, datasources=["shop"]).status == Run.Status.DONE
    asked = [request["input"] for request in scripted_model.embedding_requests]
    assert [prompt] not in asked and ["tips by taxi"] not in asked  # no endpoint, either side
    assert KnowledgeEntry.objects.filter(
        datasource=datasource, vector_model="wordllama-l2-supercat-256"
    ).exists()
    [found] = [
        m["content"] for m in request_of(scripted_model, prompt)["messages"] if m["role"] == "tool"
    ]
    assert found.startswith("[schema] taxi_trips (datasource shop)")
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    assert "PAW_EMBEDDING_MODEL" not in process_environment(sandbox.pid)
