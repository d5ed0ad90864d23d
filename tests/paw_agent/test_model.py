"""paw-agent's model calls against the scripted model: retries, auth failures, usage."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from tests.live import wait_for
from tests.paw_agent.driver import VENV_BIN, answer_text, notifies
from tests.processes import free_port


def script(*responses, fallback="Fine.", **extra):
    return {
        "api_key": "sk-runtime-test",
        "responses": list(responses),
        "fallback": fallback,
        **extra,
    }


def test_429_is_retried_after_its_retry_after(start, model):
    model.load(script({"error": 429, "retry_after": 1}, "After the wait."))
    runtime = start()
    runtime.ready()
    lines = runtime.submit("hi")
    assert lines[-1]["answer"] == "After the wait." and lines[-1]["errors"] == []
    retry = notifies(lines, "retry")
    assert len(retry) == 1
    assert retry[0]["attempt"] == 1 and retry[0]["delay"] == 1.0
    assert "HTTP 429" in retry[0]["reason"] and retry[0]["partial"] is False
    first, second = model.log
    assert second["received"] - first["received"] >= 1.0
    assert lines[-1]["usage"]["rounds"] == 1  # the refused call is not a round


def test_500s_are_retried_with_backoff(start, model):
    model.load(script({"error": 500, "times": 2}, "Third time lucky."))
    runtime = start("paw-agent", "--retry-base", "0.05")
    runtime.ready()
    lines = runtime.submit("hi")
    assert lines[-1]["answer"] == "Third time lucky."
    assert [r["attempt"] for r in notifies(lines, "retry")] == [1, 2]
    assert [e["status"] for e in model.log] == [500, 500, 200]


def test_a_stream_dropped_midway_is_retried_and_its_partial_text_flagged(start, model):
    model.load(
        script(
            {"text": "Partial text that never ends", "chunk": 4, "drop_after": 2},
            "The whole answer.",
        )
    )
    runtime = start("paw-agent", "--retry-base", "0.05")
    runtime.ready()
    lines = runtime.submit("hi")
    retry = notifies(lines, "retry")
    assert len(retry) == 1 and retry[0]["partial"] is True
    # Deltas of the failed attempt came before the retry notice; the answer is the new one.
    assert answer_text(lines) == "Partial The whole answer."
    assert lines[-1]["answer"] == "The whole answer."


def test_giving_up_after_the_last_attempt_fails_the_run(start, model):
    model.load(script({"error": 503, "times": 10}))
    runtime = start("paw-agent", "--retries", "1", "--retry-base", "0.05")
    runtime.ready()
    result = runtime.submit("hi")[-1]
    assert result["errors"][0]["code"] == "unknown"
    assert result["errors"][0]["message"].startswith("model call failed after 2 attempts: HTTP 503")
    assert len(model.log) == 2


def test_unreachable_endpoint_fails_after_retries(start):
    runtime = start(
        "paw-agent",
        "--retries",
        "1",
        "--retry-base",
        "0.05",
        env={"OPENAI_BASE_URL": f"http://127.0.0.1:{free_port()}/v1"},
    )
    runtime.ready()
    lines = runtime.submit("hi")
    assert len(notifies(lines, "retry")) == 1
    assert lines[-1]["errors"][0]["code"] == "unknown"
    assert "connection" in lines[-1]["errors"][0]["message"].lower()


def test_401_fails_the_run_at_once_with_code_auth(start, model):
    model.load(script())
    runtime = start("paw-agent", env={"OPENAI_API_KEY": "sk-wrong"})
    runtime.ready()
    lines = runtime.submit("hi")
    result = lines[-1]
    assert [e["code"] for e in result["errors"]] == ["auth"]
    assert "HTTP 401" in result["errors"][0]["message"]
    assert "OPENAI_API_KEY" in result["errors"][0]["message"]
    assert result["error_messages"] == [result["errors"][0]["message"]]
    assert notifies(lines, "error") == [result["errors"][0]["message"]]
    assert notifies(lines, "retry") == [] and len(model.log) == 1


def test_a_missing_api_key_fails_the_run_with_code_auth(start, model):
    runtime = start("paw-agent", env={"OPENAI_API_KEY": ""})
    runtime.ready()
    result = runtime.submit("hi")[-1]
    assert [e["code"] for e in result["errors"]] == ["auth"]
    assert "OPENAI_API_KEY" in result["errors"][0]["message"]
    assert model.log == []


def test_403_fails_the_run_with_code_auth(start, model):
    model.load(script({"error": 403}))
    runtime = start()
    runtime.ready()
    assert runtime.submit("hi")[-1]["errors"][0]["code"] == "auth"
    assert len(model.log) == 1


def test_missing_usage_is_estimated_and_marked(start, model):
    model.load(script({"text": "No usage from me.", "usage": False}))
    runtime = start()
    runtime.ready()
    lines = runtime.submit("hi")
    usage = lines[-1]["usage"]
    assert usage["estimated"] is True and usage["input"] > 100 and usage["output"] > 0
    assert notifies(lines, "usage")[-1] == usage


def test_usage_counts_every_model_call_of_the_run(start, model):
    exact = {"prompt_tokens": 100, "completion_tokens": 10}
    model.load(
        script(
            {"tool_calls": [{"name": "list_files", "arguments": {}}], "usage": exact},
            {"text": "Two calls.", "usage": exact},
        )
    )
    runtime = start()
    runtime.ready()
    lines = runtime.submit("hi")
    assert lines[-1]["usage"] == {"input": 200, "output": 20, "rounds": 2, "estimated": False}
    assert notifies(lines, "usage") == [
        {"input": 100, "output": 10, "rounds": 1, "estimated": False},
        {"input": 200, "output": 20, "rounds": 2, "estimated": False},
    ]


def test_requests_carry_the_tools_the_output_cap_and_stream_options(start, model):
    model.load(script())
    runtime = start("paw-agent", "--max-output-tokens", "1234")
    runtime.ready()
    runtime.submit("hi")
    body = model.requests[0]
    assert body["model"] == "scripted-model" and body["max_tokens"] == 1234
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    names = [t["function"]["name"] for t in body["tools"]]
    assert names == [
        "list_files",
        "read_file",
        "write_file",
        "run_python",
        "shell",
        "delete_file",
        "install_package",
        "ask_user",
        "update_plan",
    ]  # no datasource: no run_sql
    assert body["messages"][0]["role"] == "system"
    assert body["messages"][-1] == {"role": "user", "content": "hi"}


def test_no_stream_asks_for_whole_answers(start, model):
    model.load(script("One piece."))
    runtime = start("paw-agent", "--no-stream")
    runtime.ready()
    lines = runtime.submit("hi")
    assert [x["text"] for x in lines if x["type"] == "delta"] == ["One piece."]
    assert not model.requests[0].get("stream")
    assert lines[-1]["usage"]["input"] > 0


def test_cancel_while_the_model_has_not_answered_yet(start, model):
    model.load(script("Warm.", {"text": "never", "delay": 30}))
    runtime = start()
    runtime.ready()
    runtime.submit("warm up", run_id="r0")  # the SDK is imported, the connection open
    runtime.send({"op": "submit", "prompt": "hi", "run_id": "r1"})
    runtime.wait_for(lambda x: x["type"] == "start")
    time.sleep(0.5)  # the request is out, waiting for the first byte
    runtime.send({"op": "cancel", "run_id": "r1"})
    result = runtime.wait_for(lambda x: x["type"] == "result", timeout=10)
    assert result["cancelled"] is True and result["errors"] == []
    assert result["usage"]["rounds"] == 0


def test_rounds_reuse_one_connection(start, model):
    model.load(script({"tool_calls": [{"name": "list_files", "arguments": {}}]}, "Done."))
    runtime = start()
    runtime.ready()
    runtime.submit("hi")
    runtime.submit("again", run_id="r2")
    assert len({entry["client_port"] for entry in model.log}) == 1


def sdk_loaded(pid: int) -> bool:
    """Whether ``pid`` has loaded the openai SDK's client: its native dependency
    ``pydantic_core`` is mapped (``/proc/<pid>/maps``; readable by root although
    paw-agent is not dumpable). paw-agent's own modules never load pydantic."""
    return "pydantic_core" in Path(f"/proc/{pid}/maps").read_text()


def test_the_sdk_is_imported_right_after_ready_before_any_run(start, model):
    """The SDK's import starts at ``ready``, not with the first model call."""
    model.load(script("Warm already."))
    runtime = start()
    runtime.ready()
    wait_for(
        lambda: sdk_loaded(runtime.pid), timeout=60, what="the SDK to be imported without a run"
    )
    assert model.requests == []  # no model call made it happen
    lines = runtime.submit("hi")
    assert lines[-1]["answer"] == "Warm already."


def test_no_warm_leaves_the_sdk_to_the_first_model_call(start, model):
    model.load(script("Cold."))
    runtime = start("paw-agent", "--no-warm")
    runtime.ready()
    time.sleep(3)  # a warm-up would be done by now (it takes under a second)
    assert not sdk_loaded(runtime.pid)
    assert runtime.submit("hi")[-1]["answer"] == "Cold."
    assert sdk_loaded(runtime.pid)


#: Modules ``import openai`` loads that paw-agent never uses: every API type, the
#: resources, httpx's command line and its ``rich``.
UNUSED = ("openai.types.responses", "openai.resources", "httpx._main", "rich")

LOAD = """
import json, sys
from paw_agent.sdk import load_sdk
sdk = load_sdk()
print(json.dumps({"lean": sdk.lean, "loaded": [m for m in %r if sys.modules.get(m)]}))
"""


def test_only_the_sdks_client_is_loaded_not_its_api_types(tmp_path):
    """paw-agent's memory: the SDK's client modules, not the ~45 MB of ``import openai``
    (docs/performance.md); the model calls themselves are the other tests of this file."""
    done = subprocess.run(
        [str(VENV_BIN / "python"), "-c", LOAD % (UNUSED,)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        check=True,
    )
    assert json.loads(done.stdout) == {"lean": True, "loaded": []}


def _deltas(lines):
    return [line for line in lines if line.get("type") == "delta"]


def test_a_flood_of_pieces_shares_delta_lines_a_paced_stream_gets_one_line_each(start, model):
    """Issue 16, lines not tokens: 2,000 pieces sent back to back come out as far fewer
    ``delta`` lines with the same text, in order; pieces 30 ms apart (slower than the
    3 ms window) each get a line of their own, written as they come."""
    flood = "".join(f"{n:07d} " for n in range(1000))  # 8,000 characters: 2,000 pieces
    model.load(
        script(
            rules=[
                {"match": "^flood", "responses": [{"text": flood, "chunk": 4}]},
                {
                    "match": "^paced",
                    "responses": [{"text": "aaaabbbbccccdddd", "chunk": 4, "chunk_delay": 0.03}],
                },
            ]
        )
    )
    runtime = start()
    runtime.ready()
    lines = runtime.submit("flood")
    assert answer_text(lines) == flood and lines[-1]["answer"] == flood
    deltas = _deltas(lines)
    assert len(deltas) < 400, len(deltas)  # a line per piece would be 2,000
    assert [d["seq"] for d in deltas] == sorted(d["seq"] for d in deltas)
    lines = runtime.submit("paced")
    assert [d["text"] for d in _deltas(lines)] == ["aaaa", "bbbb", "cccc", "dddd"]


def test_with_a_zero_window_every_piece_is_a_line(start, model):
    flood = "".join(f"{n:07d} " for n in range(150))  # 1,200 characters: 300 pieces
    model.load(script({"text": flood, "chunk": 4}))
    runtime = start("paw-agent", "--delta-window", "0")
    runtime.ready()
    lines = runtime.submit("flood")
    assert answer_text(lines) == flood
    assert len(_deltas(lines)) == 300


def test_a_held_piece_is_written_at_the_windows_end_when_nothing_follows():
    """A model that pauses right after a burst: the held piece is not kept for the next
    piece or the end of the call, the buffer's own thread writes it."""
    from paw_agent.protocol import DeltaBuffer

    written: list[str] = []
    deltas = DeltaBuffer(written.append, window=0.05)
    deltas.add("a")
    deltas.add("b")
    deltas.add("c")
    assert written == ["a"]  # b and c came within the window: held
    wait_for(lambda: written == ["a", "bc"], timeout=2)
    time.sleep(0.06)
    deltas.add("d")  # after a quiet moment: at once
    assert written == ["a", "bc", "d"]
    deltas.add("e")
    deltas.flush()
    assert written == ["a", "bc", "d", "e"]
