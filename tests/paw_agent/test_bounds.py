"""paw-agent's bounds and memory: tool rounds, wall clock, context budget, remembered turns
and the ``history`` op."""

from __future__ import annotations

from tests.paw_agent.driver import notifies

LIST = {"tool_calls": [{"name": "list_files", "arguments": {}}]}


def script(*responses, fallback="Fine.", **extra):
    return {
        "api_key": "sk-runtime-test",
        "responses": list(responses),
        "fallback": fallback,
        **extra,
    }


def user_prompts(body) -> list[str]:
    return [m["content"] for m in body["messages"] if m["role"] == "user"]


def test_the_round_budget_ends_a_run_that_keeps_calling_tools(start, model):
    model.load(script(fallback=LIST))
    runtime = start("paw-agent", "--max-rounds", "2")
    runtime.ready()
    lines = runtime.submit("loop")
    result = lines[-1]
    assert [e["code"] for e in result["errors"]] == ["budget"]
    assert "round budget exhausted" in result["errors"][0]["message"]
    assert "--max-rounds 2" in result["errors"][0]["message"]
    assert len(notifies(lines, "tool")) == 2
    assert result["usage"]["rounds"] == 3 and result["cancelled"] is False


def test_the_wall_clock_limit_stops_a_model_that_does_not_answer(start, model):
    model.load(script("Warm.", {"text": "late", "delay": 60}))
    runtime = start("paw-agent", "--timeout", "6")
    runtime.ready()
    # A first run loads the SDK, so the second one is stopped while its request waits.
    assert runtime.submit("warm up", run_id="r0")[-1]["errors"] == []
    result = runtime.submit("slow", run_id="r1", timeout=30)[-1]
    assert [e["code"] for e in result["errors"]] == ["timeout"]
    assert "wall-clock limit of 6 s" in result["errors"][0]["message"]
    assert result["cancelled"] is False


def test_the_wall_clock_limit_stops_a_slow_tool(start, model):
    model.load(
        script(
            {
                "tool_calls": [
                    {"name": "run_python", "arguments": {"code": "import time; time.sleep(60)"}}
                ]
            }
        )
    )
    runtime = start("paw-agent", "--timeout", "3")
    runtime.ready()
    result = runtime.submit("slow", timeout=30)[-1]
    assert [e["code"] for e in result["errors"]] == ["timeout"]


def test_only_the_last_memory_turns_are_sent(start, model):
    model.load(script())
    runtime = start("paw-agent", "--memory-turns", "2")
    runtime.ready()
    for n in range(1, 5):
        runtime.submit(f"prompt {n}", run_id=f"r{n}")
    assert user_prompts(model.requests[-1]) == ["prompt 2", "prompt 3", "prompt 4"]
    assert model.requests[-1]["messages"][2] == {"role": "assistant", "content": "Fine."}


def test_history_seeds_the_memory_of_a_fresh_process(start, model):
    model.load(script())
    runtime = start("paw-agent", "--memory-turns", "2")
    runtime.ready()
    turns = [{"prompt": f"old {n}", "answer": f"answer {n}"} for n in range(3)]
    runtime.send({"op": "history", "turns": turns, "op_id": "h1"})
    runtime.submit("new")
    messages = model.requests[0]["messages"][1:]
    assert messages == [
        {"role": "user", "content": "old 1"},
        {"role": "assistant", "content": "answer 1"},
        {"role": "user", "content": "old 2"},
        {"role": "assistant", "content": "answer 2"},
        {"role": "user", "content": "new"},
    ]
    assert not [x for x in runtime.lines if x["type"] == "error"]  # silent on success


def test_history_refusals(start, model):
    model.load(script({"text": "slow " * 200, "chunk": 5, "chunk_delay": 0.05}))
    runtime = start()
    runtime.ready()
    for op in (
        {"op": "history", "op_id": "h1"},
        {"op": "history", "turns": [{"prompt": "x"}], "op_id": "h2"},
        {"op": "history", "turns": "nope", "op_id": "h3"},
    ):
        runtime.send(op)
        error = runtime.error()
        assert (
            error["message"] == 'history requires "turns": a list of {"prompt": str, "answer": str}'
        )
        assert error["op_id"] == op["op_id"]
    runtime.send({"op": "submit", "prompt": "talk", "run_id": "r1"})
    runtime.wait_for(lambda x: x["type"] == "delta")
    runtime.send({"op": "history", "turns": [], "op_id": "h4"})
    error = runtime.error()
    assert error["message"] == "history cannot be loaded while a run is active"
    assert error["op_id"] == "h4"


def test_over_the_context_budget_older_turns_are_summarized(start, model):
    model.load(script(untooled="SUMMARY: the user is Ada and likes tips data."))
    runtime = start("paw-agent", "--context-budget", "4000", "--max-output-tokens", "500")
    runtime.ready()
    turns = [{"prompt": f"question {n} " + "x" * 3000, "answer": f"answer {n}"} for n in range(3)]
    runtime.send({"op": "history", "turns": turns})
    lines = runtime.submit("What do you know about me?")
    summary_call, main_call = model.requests
    assert "tools" not in summary_call and "question 0" in summary_call["messages"][1]["content"]
    system = [m["content"] for m in main_call["messages"] if m["role"] == "system"]
    assert system[1] == (
        "Summary of the earlier conversation:\nSUMMARY: the user is Ada and likes tips data."
    )
    assert "question 0" not in str(main_call["messages"])
    compact = notifies(lines, "compact")
    assert compact and compact[0]["summarized"] is True and compact[0]["dropped_turns"] >= 1
    assert lines[-1]["usage"]["rounds"] == 2  # the summary call is billed too
    assert lines[-1]["errors"] == []


def test_a_huge_tool_output_is_cut_to_fit_the_budget(start, model):
    model.load(
        script(
            {"tool_calls": [{"name": "run_python", "arguments": {"code": "print('y' * 19000)"}}]}
        )
    )
    runtime = start("paw-agent", "--context-budget", "5000", "--max-output-tokens", "500")
    runtime.ready()
    lines = runtime.submit("big output", timeout=120)
    assert lines[-1]["errors"] == []
    tool_message = next(m for m in model.requests[-1]["messages"] if m["role"] == "tool")
    assert tool_message["content"].endswith("[cut to fit the context budget]")
    assert 1000 < len(tool_message["content"]) < 19000
    assert notifies(lines, "compact")[0]["cut_tool_output"] is True


def test_a_prompt_beyond_the_context_budget_fails_with_code_context(start, model):
    model.load(script())
    runtime = start("paw-agent", "--context-budget", "3000", "--max-output-tokens", "500")
    runtime.ready()
    result = runtime.submit("z" * 20000)[-1]
    assert [e["code"] for e in result["errors"]] == ["context"]
    assert "context budget of 3000" in result["errors"][0]["message"]
    assert model.requests == []  # never sent to the provider
