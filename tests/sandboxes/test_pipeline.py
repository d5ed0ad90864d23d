"""The node's event pipeline (``sandboxes/pipeline.py``): lines read from real runtime
processes are stored once, in order, with increasing cursors, and sent live; garbage is kept
as events."""

from __future__ import annotations

import uuid

import pytest

from conversations.models import Run, RunEvent
from conversations.services.events import EventDraft
from conversations.services.runs import run_start
from sandboxes.models import Sandbox
from sandboxes.pipeline import coalesce_deltas
from tests.factories import ConversationFactory
from tests.live import GroupListener, wait_for
from tests.sandboxes.observe import (
    finished,
)
from tests.sandboxes.scenarios import start_with_mode

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

RUN_A, RUN_B = uuid.uuid4(), uuid.uuid4()


def test_a_run_end_to_end_is_stored_with_increasing_cursors_and_sent_live(worker, scripted_model):
    scripted_model.load(
        {
            "api_key": "sk-scripted-test-key",
            "untooled": "A title",
            "fallback": "Hello from the model.",
        }
    )
    conversation = ConversationFactory()
    with GroupListener(conversation.id) as listener:
        run = run_start(
            user=conversation.user, conversation_id=conversation.id, prompt="Say hello."
        )
        done = wait_for(lambda: finished(run.id), what="the run to finish")
        listener.wait(
            lambda lis: any(e["event"]["type"] == "result" for e in lis.events()),
            what="result live",
        )
    assert done.status == Run.Status.DONE, (done.errors, worker.output()[-3000:])
    assert "Hello from the model." in done.answer
    assert done.usage["input"] > 0 and done.usage["output"] > 0
    stored = list(RunEvent.objects.filter(conversation=conversation).order_by("cursor"))
    cursors = [e.cursor for e in stored]
    assert cursors == list(range(1, len(stored) + 1))
    assert stored[0].type == "start" and stored[-1].type == "result"
    live = listener.events()
    assert [e["cursor"] for e in live] == cursors
    assert [e["event"] for e in live] == [e.payload for e in stored]
    statuses = [m["status"] for m in listener.of_type("run.status")]
    assert statuses[-1] == "done" and "running" in statuses
    sandbox = Sandbox.objects.get(conversation=conversation)
    assert sandbox.state == Sandbox.State.READY and sandbox.pid


def test_garbage_lines_are_kept_as_events_and_the_run_still_finishes(fake_worker):
    conversation, run = start_with_mode("garbage")
    run = wait_for(lambda: finished(run.id))
    assert run.status == Run.Status.DONE and run.answer == "survived"
    events = list(RunEvent.objects.filter(conversation=conversation).order_by("cursor"))
    types = [(e.type, e.kind) for e in events]
    assert types[0] == ("start", "")
    malformed = [e.payload for e in events if e.kind == "malformed"]
    assert [m["message"] for m in malformed[:3]] == [
        "this is not json",
        "[1, 2, 3]",
        '{"no_type": true}',
    ]
    assert malformed[3]["message"].endswith(" [cut]") and len(malformed[3]["message"]) < 5000
    assert ("mystery", "") in types  # unknown types are relayed, not dropped
    # A NUL character (which PostgreSQL cannot store) does not cost the line.
    assert "nul\ufffdhere" in [e.payload.get("text") for e in events]
    notices = [e.payload["message"] for e in events if e.type == "notice"]
    assert any("missing before seq 5" in n for n in notices)
    assert any("someone-else" in n for n in notices)
    assert [e for e in events if e.type != "notice"][-1].type == "result"
    assert all(e.run_id == run.id for e in events)


def test_a_fast_flood_of_lines_is_stored_exactly_once_in_order(fake_worker):
    conversation, run = start_with_mode("flood 5000")
    with GroupListener(conversation.id) as listener:
        run = wait_for(lambda: finished(run.id), timeout=60)
        listener.wait(
            lambda lis: any(e["event"]["type"] == "result" for e in lis.events()), what="all events"
        )
    assert run.status == Run.Status.DONE
    deltas = list(
        RunEvent.objects.filter(conversation=conversation, type="delta")
        .order_by("cursor")
        .values_list("payload", flat=True)
    )
    assert "".join(d["text"] for d in deltas) == "".join(f"{n} " for n in range(1, 5001))
    # Lines that queued while the node was busy were joined: fewer events than lines.
    assert len(deltas) < 5000
    live = [e["event"] for e in listener.events() if e["event"]["type"] == "delta"]
    assert live == deltas


def draft(type_: str, text: str = "", run=RUN_A, seq: int = 0) -> EventDraft:
    payload = {"type": type_, "seq": seq, "run_id": str(run)}
    if type_ == "delta":
        payload["text"] = text
    return EventDraft(run_id=run, type=type_, payload=payload)


def test_consecutive_deltas_of_a_run_are_joined_and_nothing_else_is():
    drafts = [
        draft("start", seq=1),
        draft("delta", "Hel", seq=2),
        draft("delta", "lo", seq=3),
        draft("delta", " there", seq=4),
        draft("notify", seq=5),
        draft("delta", "again", seq=6),
        draft("delta", ", other run", run=RUN_B, seq=1),
        draft("delta", "no run", run=None),
        draft("delta", "no run either", run=None),
        draft("result", seq=7),
    ]
    joined = coalesce_deltas(drafts)
    assert [(d.type, d.payload.get("text"), d.payload["seq"]) for d in joined] == [
        ("start", None, 1),
        ("delta", "Hello there", 4),  # the last joined line's other fields
        ("notify", None, 5),
        ("delta", "again", 6),
        ("delta", ", other run", 1),
        ("delta", "no run", 0),
        ("delta", "no run either", 0),
        ("result", None, 7),
    ]
    assert drafts[1].payload["text"] == "Hel"  # the drafts given are left as they were
    assert coalesce_deltas([]) == []
