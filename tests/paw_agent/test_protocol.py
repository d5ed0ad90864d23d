"""Protocol v1 conformance (PROTOCOL.md): the same cases against ``paw-agent serve`` and
the public ``python-agent-harness serve``, both real processes against the scripted
model. Error wording is python-agent-harness's; paw-agent must match it."""

from __future__ import annotations

import json
import signal
import time

import pytest

from paw_agent.protocol import HARNESS_CAPABILITIES
from tests.paw_agent.driver import HARNESS, PAW_AGENT, RUNTIMES, answer_text, notifies, of_type

pytestmark = pytest.mark.parametrize("kind", RUNTIMES)

SLOW_TEXT = {"text": "word " * 400, "chunk": 5, "chunk_delay": 0.05}  # ~20 s of deltas


def ask_call(kind: str) -> dict:
    """A scripted step calling the runtime's question tool."""
    if kind == PAW_AGENT:
        return {
            "tool_calls": [
                {
                    "name": "ask_user",
                    "arguments": {"question": "Which day?", "options": ["Sat", "Sun"]},
                }
            ]
        }
    return {
        "tool_calls": [
            {
                "name": "Question",
                "arguments": {"questions": [{"question": "Which day?", "options": ["Sat", "Sun"]}]},
            }
        ]
    }


def script(*responses, fallback="Hello from the model."):
    return {
        "api_key": "sk-runtime-test",
        "untooled": "A title",
        "responses": list(responses),
        "fallback": fallback,
    }


def submit_when_free(runtime, prompt, run_id):
    """Submit, retrying while the previous run is still winding down (PROTOCOL.md: retry
    a refused submit after ~50 ms)."""
    for _ in range(40):
        runtime.send({"op": "submit", "prompt": prompt, "run_id": run_id, "op_id": run_id})
        line = runtime.wait_for(lambda x: x.get("run_id") == run_id or x.get("op_id") == run_id)
        if line["type"] == "start":
            return [line, *runtime.run_lines(run_id)]
        assert line["message"] == "a run is already active"
        time.sleep(0.05)
    raise AssertionError("the runtime never accepted the next submit")


def test_ready_is_the_first_line(kind, start):
    runtime = start(kind)
    ready = runtime.ready()
    assert ready["protocol"] == 1 and ready["protocol_version"] == 1
    assert ready["pid"] == runtime.pid
    assert ready["capabilities"][: len(HARNESS_CAPABILITIES)] == list(HARNESS_CAPABILITIES)
    assert ("history" in ready["capabilities"]) is (kind == PAW_AGENT)
    assert "run_id" not in ready and "seq" not in ready


def test_submit_streams_a_run_from_start_to_result(kind, start, model):
    model.load(script())
    runtime = start(kind)
    runtime.ready()
    lines = runtime.submit("Say hello.", run_id="run-a")
    assert lines[0]["type"] == "start" and lines[0]["prompt"] == "Say hello."
    assert [x["seq"] for x in lines] == list(range(1, len(lines) + 1))
    assert all(x["run_id"] == "run-a" and x["protocol"] == 1 for x in lines)
    assert "Hello from the model." in answer_text(lines)
    result = lines[-1]
    assert result["answer"] == "Hello from the model."
    assert result["errors"] == [] and result["error_messages"] == []
    assert result["cancelled"] is False and result["model"] == "scripted-model"
    assert result["usage"]["input"] > 0 and result["usage"]["output"] > 0
    assert result["usage"]["rounds"] >= 1
    usage = notifies(lines, "usage")
    assert usage and usage[-1]["input"] == result["usage"]["input"]
    # A second run numbers its lines from 1 again.
    again = submit_when_free(runtime, "Again.", "run-b")
    assert again[0]["seq"] == 1 and again[-1]["type"] == "result"


def test_ask_is_answered_and_the_run_goes_on(kind, start, model):
    model.load(script(ask_call(kind), fallback="You chose Sun."))
    runtime = start(kind)
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "Pick a day.", "run_id": "r1"})
    ask = runtime.wait_for(lambda x: x.get("kind") == "ask")["data"]
    assert ask["kind"] == "ask" and isinstance(ask["ask_id"], str) and ask["ask_id"]
    assert ask["questions"][0]["question"] == "Which day?"
    assert ask["questions"][0]["options"] == ["Sat", "Sun"]
    runtime.send({"op": "answer", "run_id": "r1", "answers": ["Sun"], "ask_id": ask["ask_id"]})
    result = runtime.run_lines("r1")[-1]
    assert result["answer"] == "You chose Sun." and result["errors"] == []
    tool_results = [
        m["content"] for body in model.requests for m in body["messages"] if m["role"] == "tool"
    ]
    assert any("Sun" in str(content) for content in tool_results)


def test_refusals_while_a_question_is_pending(kind, start, model):
    model.load(script(ask_call(kind), fallback="Done."))
    runtime = start(kind)
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "Pick a day.", "run_id": "r1"})
    ask = runtime.wait_for(lambda x: x.get("kind") == "ask")["data"]
    cases = [
        (
            {"op": "submit", "prompt": "more", "run_id": "r2", "op_id": "s2"},
            "a run is already active",
        ),
        (
            {"op": "answer", "run_id": "r1", "answers": ["Sat"], "ask_id": "nope", "op_id": "a1"},
            f"stale answer: ask_id nope is not the pending question ({ask['ask_id']}) for run r1",
        ),
        (
            {"op": "answer", "run_id": "other", "answers": ["Sat"], "op_id": "a2"},
            "no pending question for run other",
        ),
        ({"op": "cancel", "run_id": "other", "op_id": "c1"}, "run other is not active"),
    ]
    for op, message in cases:
        runtime.send(op)
        error = runtime.error()
        assert error["error"] == {"code": "protocol", "message": message}
        assert error["message"] == message and error["op_id"] == op["op_id"]
        assert "run_id" not in error and "seq" not in error
    runtime.send({"op": "answer", "run_id": "r1", "answers": ["Sun"], "ask_id": ask["ask_id"]})
    assert runtime.run_lines("r1")[-1]["answer"] == "Done."


def test_cancel_mid_stream_ends_the_run_cancelled(kind, start, model):
    model.load(script(SLOW_TEXT, fallback="Next answer."))
    runtime = start(kind)
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "Talk slowly.", "run_id": "r1"})
    runtime.wait_for(lambda x: x["type"] == "delta")
    runtime.send({"op": "cancel", "run_id": "r1", "op_id": "c1"})
    # The scripted stream would last ~20 s: only a working cancel ends the run in time.
    result = runtime.wait_for(lambda x: x["type"] == "result", timeout=10)
    assert result["run_id"] == "r1" and result["cancelled"] is True
    runtime.send({"op": "ping", "op_id": "after"})
    pong = runtime.wait_for(lambda x: x["type"] == "pong")
    assert pong["op_id"] == "after"
    assert not [x for x in runtime.lines if x.get("run_id") == "r1" and x["_at"] > result["_at"]]
    # The process serves the next run normally.
    assert submit_when_free(runtime, "Again.", "r2")[-1]["cancelled"] is False


def test_answer_with_no_question_pending_during_a_run_is_refused(kind, start, model):
    model.load(script(SLOW_TEXT))
    runtime = start(kind)
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "Talk slowly.", "run_id": "r1"})
    runtime.wait_for(lambda x: x["type"] == "delta")
    runtime.send({"op": "answer", "run_id": "r1", "answers": ["x"], "op_id": "a1"})
    error = runtime.error()
    assert error["message"] == "no pending question for run r1" and error["op_id"] == "a1"
    runtime.send({"op": "cancel", "run_id": "r1"})
    assert runtime.wait_for(lambda x: x["type"] == "result", timeout=10)["cancelled"] is True


def test_ping_and_hello_echo_op_id(kind, start):
    runtime = start(kind)
    runtime.ready()
    runtime.send({"op": "ping", "op_id": "p-42"})
    assert runtime.next() == {**runtime.lines[-1], "type": "pong", "op_id": "p-42", "protocol": 1}
    runtime.send({"op": "ping"})
    assert "op_id" not in runtime.next()
    runtime.send({"op": "hello", "protocol_versions": [1, 2], "op_id": "h-1"})
    hello = runtime.next()
    assert hello["type"] == "hello" and hello["protocol_version"] == 1
    assert hello["op_id"] == "h-1" and hello["pid"] == runtime.pid
    assert hello["capabilities"][: len(HARNESS_CAPABILITIES)] == list(HARNESS_CAPABILITIES)


@pytest.mark.parametrize(
    ("line", "message", "op_id"),
    [
        ("{not json", "malformed op line", None),
        ("[1, 2]", "op must be an object with a string 'op' field", None),
        ({"op_id": "e1"}, "op must be an object with a string 'op' field", "e1"),
        ({"op": 7, "op_id": "e2"}, "op must be an object with a string 'op' field", "e2"),
        ({"op": "fly", "op_id": "e3"}, "unknown op: fly", "e3"),
        ({"op": "submit", "prompt": "hi", "op_id": "e4"}, "submit requires run_id", "e4"),
        (
            {"op": "submit", "run_id": "r", "prompt": "  ", "op_id": "e5"},
            "submit requires a non-empty prompt",
            "e5",
        ),
        (
            {"op": "submit", "run_id": "r", "op_id": "e6"},
            "submit requires a non-empty prompt",
            "e6",
        ),
        (
            {"op": "answer", "run_id": "r", "answers": [], "op_id": "e7"},
            "answer requires a non-empty answers list",
            "e7",
        ),
        (
            {"op": "answer", "run_id": "r", "answers": ["yes"], "op_id": "e8"},
            "no pending question for run r",
            "e8",
        ),
        ({"op": "cancel", "run_id": "r", "op_id": "e9"}, "run r is not active", "e9"),
        ({"op": "cancel", "op_id": "e10"}, "run (missing) is not active", "e10"),
        (
            {"op": "hello", "protocol_versions": [7], "op_id": "e11"},
            "no shared protocol version: host accepts [7], this build speaks 1",
            "e11",
        ),
    ],
    ids=lambda value: value if isinstance(value, str) and len(value) < 12 else None,
)
def test_every_refused_op_gets_an_error_line_and_the_process_lives_on(
    kind, start, line, message, op_id
):
    runtime = start(kind)
    runtime.ready()
    runtime.send(line if isinstance(line, str) else json.dumps(line))
    error = runtime.next()
    assert error["type"] == "error" and error["protocol"] == 1
    assert error["error"] == {"code": "protocol", "message": message}
    assert error["message"] == message
    assert error.get("op_id") == op_id
    runtime.send({"op": "ping", "op_id": "alive"})
    assert runtime.next()["type"] == "pong"


def stop(runtime, how: str) -> None:
    """Ask the runtime to stop the way a host may: ``shutdown`` op, closed stdin, SIGTERM."""
    if how == "shutdown":
        runtime.send({"op": "shutdown"})
    elif how == "eof":
        runtime.close_stdin()
    else:
        runtime.process.send_signal(signal.SIGTERM)


@pytest.mark.parametrize("how", ["shutdown", "eof", "sigterm"])
def test_idle_process_stops_with_exit_code_0(kind, start, how):
    runtime = start(kind)
    runtime.ready()
    if kind == HARNESS:
        # python-agent-harness installs its SIGTERM handler just after writing ready: a
        # round trip makes sure it is in place (paw-agent installs it before ready).
        runtime.send({"op": "ping"})
        runtime.next()
    stop(runtime, how)
    assert runtime.wait_exit() == 0
    assert runtime.remaining_lines() == []


@pytest.mark.parametrize("how", ["shutdown", "eof", "sigterm"])
def test_stopping_mid_run_writes_the_cancelled_result_then_exits_0(kind, start, model, how):
    model.load(script(SLOW_TEXT))
    runtime = start(kind)
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "Talk slowly.", "run_id": "r1"})
    runtime.wait_for(lambda x: x["type"] == "delta")
    stop(runtime, how)
    assert runtime.wait_exit() == 0
    rest = runtime.remaining_lines()
    results = of_type(rest, "result")
    assert len(results) == 1 and results[0]["cancelled"] is True
    assert results[0]["run_id"] == "r1" and rest[-1] is results[0]


def test_harness_refuses_the_history_op_paw_agent_takes_it(kind, start):
    runtime = start(kind)
    runtime.ready()
    runtime.send({"op": "history", "turns": [{"prompt": "a", "answer": "b"}], "op_id": "h"})
    runtime.send({"op": "ping", "op_id": "p"})
    line = runtime.next()
    if kind == HARNESS:
        assert line["message"] == "unknown op: history" and line["op_id"] == "h"
    else:
        assert line == {**line, "type": "pong", "op_id": "p"}
