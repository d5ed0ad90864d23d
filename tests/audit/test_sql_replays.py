"""The audit keeps one row per statement whatever the runtime writes: a ``tool`` line
written twice, or one for a call never announced, adds nothing; a call whose result never
comes (the sandbox died) is recorded ``interrupted``; and the same effects applied again
(a retried batch) record nothing twice."""

from __future__ import annotations

import datetime
import sqlite3
import uuid
from dataclasses import dataclass

import pytest

from audit.models import SqlStatement
from conversations.models import Run
from conversations.services.run_effects import LineKind, RunEffects, RunLine, SqlCall
from tests.factories import ConversationFactory, datasource_made
from tests.live import wait_for
from tests.sandboxes.scenarios import FAKE, start_with_mode

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.fixture
def shop(tmp_path):
    path = tmp_path / "shop.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (day TEXT)")
    return datasource_made(
        slug="shop", name="Shop", dialect="sqlite", connection={"database": str(path)}
    )


def test_replayed_and_unannounced_tool_lines_add_nothing_and_a_lost_result_is_interrupted(
    worker_node, shop
):
    worker = worker_node.use(FAKE, PAW_SANDBOX_ISOLATION="none")
    conversation, run = start_with_mode("sql-replay")
    ended = wait_for(
        lambda: Run.objects.filter(id=run.id, status__in=Run.FINISHED_STATUSES).first(),
        what="the run to end",
    )
    assert ended.errors[0]["code"] == "sandbox_exited", (ended.errors, worker.output()[-3000:])
    rows = list(SqlStatement.objects.filter(run_id=run.id).order_by("ordinal"))
    assert [
        (r.ordinal, r.statement, r.kind, r.outcome, r.row_count, r.duration_ms) for r in rows
    ] == [
        (1, "SELECT day FROM orders", "read", "ok", 3, 7),
        (2, "SELECT 2", "read", "interrupted", None, None),
    ]
    assert {(r.conversation_id, r.user_id) for r in rows} == {
        (conversation.id, conversation.user_id)
    }


@dataclass
class NodeRun:
    """What the domain is given of a run the node executes (a ``RunControl``): its ids."""

    run_id: uuid.UUID
    user_id: int
    forced: tuple[str, str] | None = None
    usage: dict | None = None
    allowed_tools: frozenset[str] | None = None
    gated: bool = True


def test_the_same_statement_applied_again_is_not_recorded_twice(shop):
    conversation = ConversationFactory()
    control = NodeRun(run_id=uuid.uuid4(), user_id=conversation.user_id)
    call = {"name": "run_sql", "args": {}, "input": {"datasource": "shop", "query": "SELECT 1"}}
    line = RunLine(
        run=control,
        kind=LineKind.SQL,
        data=SqlCall(
            ordinal=1,
            conversation_id=conversation.id,
            call=call,
            at=datetime.datetime.now(datetime.UTC),
            result={"name": "run_sql", "ok": True, "sql_run": {"duration_ms": 1, "row_count": 1}},
        ),
    )
    effects = RunEffects()
    effects.apply([line, line])  # a batch holding it twice
    effects.apply([line])  # a batch stored again
    [row] = SqlStatement.objects.filter(run_id=control.run_id)
    assert (row.ordinal, row.outcome, row.row_count, row.username) == (
        1, "ok", 1, conversation.user.username,
    )  # fmt: skip
