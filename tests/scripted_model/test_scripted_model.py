"""The scripted OpenAI-compatible model server, driven by the real ``openai`` client."""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import httpx
import openai
import pytest

from scripted_model import Script, ScriptedModel, ScriptError
from tests.processes import PYTHON, ROOT, child_process, free_port, http_get, output_of, wait_http

TOOLS = [
    {"type": "function", "function": {"name": "run_python", "parameters": {"type": "object"}}},
    {"type": "function", "function": {"name": "list_files", "parameters": {"type": "object"}}},
]


def client(model: ScriptedModel, key: str = "sk-test") -> openai.OpenAI:
    return openai.OpenAI(base_url=model.base_url, api_key=key, max_retries=0, timeout=10)


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def stream_chat(model: ScriptedModel, messages: list[dict], **kwargs) -> tuple[list, list]:
    """(text pieces, all chunks) of a streamed completion with the usage chunk requested."""
    chunks = list(
        client(model).chat.completions.create(
            model="scripted-model",
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
            **kwargs,
        )
    )
    pieces = [
        c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content
    ]
    return pieces, chunks


def test_streams_text_in_chunks_and_ends_with_a_usage_chunk():
    with ScriptedModel([{"text": "abcdefghijklmnopqrstuvwxyz", "chunk": 5}]) as model:
        pieces, chunks = stream_chat(model, [user("hi")])
    assert pieces == ["abcde", "fghij", "klmno", "pqrst", "uvwxy", "z"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == 6  # 26 chars / 4
    assert chunks[-1].usage.prompt_tokens > 0
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_streamed_tool_call_arrives_in_argument_pieces_that_join_to_the_json():
    code = "import pandas as pd\nprint(pd.__version__)\n" * 3
    step = {"tool_calls": [{"name": "run_python", "arguments": {"code": code}}], "arg_chunk": 10}
    with ScriptedModel([step]) as model:
        _, chunks = stream_chat(model, [user("go")], tools=TOOLS)
    calls = [tc for c in chunks if c.choices for tc in (c.choices[0].delta.tool_calls or [])]
    assert calls[0].id.startswith("call_") and calls[0].function.name == "run_python"
    arguments = "".join(tc.function.arguments or "" for tc in calls)
    assert json.loads(arguments) == {"code": code}
    assert len(calls) > 5  # really streamed in pieces
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


def test_non_streaming_answer_carries_tool_calls_and_usage():
    step = {
        "text": "Let me look.",
        "tool_calls": [
            {"name": "list_files", "arguments": {"path": "."}, "id": "call_1"},
            {"name": "run_python", "arguments": '{"code": "1+1"}'},
        ],
        "usage": {"prompt_tokens": 100, "completion_tokens": 7},
    }
    with ScriptedModel([step]) as model:
        response = client(model).chat.completions.create(
            model="scripted-model", messages=[user("go")], tools=TOOLS
        )
    message = response.choices[0].message
    assert message.content == "Let me look."
    assert (message.tool_calls[0].id, message.tool_calls[0].function.name) == (
        "call_1",
        "list_files",
    )
    assert json.loads(message.tool_calls[1].function.arguments) == {"code": "1+1"}
    assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (100, 7)
    assert response.choices[0].finish_reason == "tool_calls"


def test_usage_false_omits_usage_streamed_and_not():
    with ScriptedModel([{"text": "x", "usage": False}] * 2) as model:
        _, chunks = stream_chat(model, [user("a")])
        response = client(model).chat.completions.create(
            model="scripted-model", messages=[user("b")]
        )
    assert all(c.usage is None for c in chunks)
    assert response.usage is None


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (401, openai.AuthenticationError),
        (403, openai.PermissionDeniedError),
        (429, openai.RateLimitError),
        (500, openai.InternalServerError),
    ],
)
def test_scripted_http_errors(status, error):
    with ScriptedModel([{"error": status, "retry_after": 2}, "after"]) as model:
        with pytest.raises(error) as raised:
            client(model).chat.completions.create(model="m", messages=[user("a")])
        assert raised.value.status_code == status
        assert raised.value.response.headers["retry-after"] == "2"
        # The error consumed its step: the next request gets the next one.
        pieces, _ = stream_chat(model, [user("b")])
    assert "".join(pieces) == "after"
    assert [e["status"] for e in model.log] == [status, 200]


def test_times_repeats_a_step():
    with ScriptedModel([{"error": 500, "times": 2}, "ok"]) as model:
        for _ in range(2):
            with pytest.raises(openai.InternalServerError):
                client(model).chat.completions.create(model="m", messages=[user("a")])
        assert (
            client(model)
            .chat.completions.create(model="m", messages=[user("a")])
            .choices[0]
            .message.content
            == "ok"
        )


def test_a_stream_dropped_midway_breaks_the_client_after_partial_text():
    with ScriptedModel([{"text": "0123456789" * 3, "chunk": 5, "drop_after": 2}, "next"]) as model:
        received = []
        with pytest.raises((httpx.HTTPError, openai.APIConnectionError)):
            for chunk in client(model).chat.completions.create(
                model="m", messages=[user("a")], stream=True
            ):
                if chunk.choices and chunk.choices[0].delta.content:
                    received.append(chunk.choices[0].delta.content)
        assert received == ["01234", "56789"]
        # The server still serves the next request on a fresh connection.
        assert "".join(stream_chat(model, [user("b")])[0]) == "next"
    assert model.log[0]["dropped"] is True


def test_delay_waits_before_answering():
    with ScriptedModel([{"text": "slow", "delay": 0.3}]) as model:
        started = time.monotonic()
        stream_chat(model, [user("a")])
        assert time.monotonic() - started >= 0.3
    assert model.log[0]["duration"] >= 0.3


def test_rules_pick_steps_by_round_and_fall_back_past_their_end():
    script = {
        "rules": [
            {
                "match": "average tip",
                "when_tool": "run_python",
                "responses": [
                    {"tool_calls": [{"name": "run_python", "arguments": {"code": "print(1)"}}]},
                    {"text": "Result: {{tool_result}} for {{prompt}}"},
                ],
            }
        ],
        "responses": ["ordered"],
        "fallback": "fallback text",
    }
    call = {"id": "c1", "type": "function", "function": {"name": "run_python", "arguments": "{}"}}
    turn = [user("What is the Average tip?")]
    after_tool = [
        *turn,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "3.1"},
    ]
    with ScriptedModel(script) as model:
        c = client(model)
        first = c.chat.completions.create(model="m", messages=turn, tools=TOOLS)
        assert first.choices[0].message.tool_calls[0].function.name == "run_python"
        second = c.chat.completions.create(model="m", messages=after_tool, tools=TOOLS)
        assert second.choices[0].message.content == "Result: 3.1 for What is the Average tip?"
        past_end = [*after_tool, {"role": "assistant", "content": "x"}]
        assert (
            c.chat.completions.create(model="m", messages=past_end, tools=TOOLS)
            .choices[0]
            .message.content
            == "fallback text"
        )
        # Without the run_python tool the rule does not apply: the ordered list answers.
        assert (
            c.chat.completions.create(model="m", messages=turn).choices[0].message.content
            == "ordered"
        )
        assert (
            c.chat.completions.create(model="m", messages=[user("other")], tools=TOOLS)
            .choices[0]
            .message.content
            == "fallback text"
        )
    assert [e["source"] for e in model.log] == [
        "rules[0][0]",
        "rules[0][1]",
        "rules[0]:fallback",
        "responses[0]",
        "fallback",
    ]


def tools(*names: str) -> list[dict]:
    return [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
        for n in names
    ]


def test_rules_can_require_tools_offered_or_not_and_what_the_system_message_says():
    """when_tool (all of a list), unless_tool, when_system / unless_system (multiline
    regexes on the system messages), and {{system_match}} naming what when_system found."""
    listing = "^- ([\\w-]+): .+ \\(sqlite\\)"
    script = {
        "rules": [
            {"match": "chart", "when_tool": ["run_sql", "run_python"], "when_system": "^- demo: ",
             "responses": ["sql and python on demo"]},
            {"match": "tips", "when_tool": "run_sql", "unless_tool": "run_python",
             "when_system": "^- demo: ", "responses": ["sql only on demo"]},
            {"match": "", "when_tool": "run_sql", "unless_system": "^- demo: ",
             "when_system": listing, "responses": ["not demo but {{system_match}}"]},
        ],
        "fallback": "fallback",
    }  # fmt: skip

    def system(*slugs: str) -> dict:
        lines = ["You are an agent.", "- Paths are relative: no '..'.", "Datasources:"]
        return {
            "role": "system",
            "content": "\n".join([*lines, *(f"- {s}: {s.title()} (sqlite)" for s in slugs)]),
        }

    with ScriptedModel(script) as model:
        c = client(model)

        def answer(messages, offered):
            return (
                c.chat.completions.create(model="m", messages=messages, tools=offered)
                .choices[0]
                .message.content
            )

        assert (
            answer([system("demo"), user("tips chart")], tools("run_sql", "run_python"))
            == "sql and python on demo"
        )
        assert answer([system("demo"), user("chart")], tools("run_sql")) == "fallback"
        assert answer([system("demo"), user("tips")], tools("run_sql", "run_python")) == "fallback"
        assert (
            answer([system("shop", "demo"), user("tips")], tools("run_sql", "ask_user"))
            == "sql only on demo"
        )
        assert answer([system("demo"), user("tips")], tools("run_python")) == "fallback"
        assert (
            answer([system("shop"), user("tips")], tools("run_sql", "run_python"))
            == "not demo but shop"
        )
        assert (
            answer([system("shop", "crm", "shop"), user("x")], tools("run_sql"))
            == "not demo but shop, crm"
        )
        assert answer([system(), user("x")], tools("run_sql")) == "fallback"  # no datasource listed
    assert [e["source"] for e in model.log] == [
        "rules[0][0]", "fallback", "fallback", "rules[1][0]", "fallback", "rules[2][0]",
        "rules[2][0]", "fallback",
    ]  # fmt: skip


def test_untooled_requests_consume_nothing():
    script = {"responses": ["first", "second"], "untooled": "A title"}
    with ScriptedModel(script) as model:
        c = client(model)
        assert (
            c.chat.completions.create(model="m", messages=[user("a")]).choices[0].message.content
            == "A title"
        )
        assert (
            c.chat.completions.create(model="m", messages=[user("a")], tools=TOOLS)
            .choices[0]
            .message.content
            == "first"
        )
        assert model.script.remaining == 1


def test_api_key_mismatch_gets_401():
    with ScriptedModel({"api_key": "sk-right", "responses": ["ok"]}) as model:
        with pytest.raises(openai.AuthenticationError):
            client(model, key="sk-wrong").chat.completions.create(model="m", messages=[user("a")])
        assert (
            client(model, key="sk-right")
            .chat.completions.create(model="m", messages=[user("a")])
            .choices[0]
            .message.content
            == "ok"
        )


def test_models_log_and_script_endpoints():
    with ScriptedModel({"model": "demo-1", "models": ["demo-1", "demo-2"]}) as model:
        assert [m.id for m in client(model).models.list()] == ["demo-1", "demo-2"]
        assert http_get(model.base_url + "/models/nope")[0] == 404
        stream_chat(model, [user("hello there")])
        status, body, _ = http_get(model.base_url.removesuffix("/v1") + "/_log")
        assert status == 200
        log = json.loads(body)
        assert log[0]["body"]["messages"][-1]["content"] == "hello there"
        assert log[0]["authorization"] == "Bearer sk-test"
        request = urllib.request.Request(  # noqa: S310 - loopback
            model.base_url.removesuffix("/v1") + "/_script",
            method="POST",
            data=json.dumps(["replaced"]).encode(),
        )
        with urllib.request.urlopen(request) as response:  # noqa: S310 - loopback
            assert response.status == 200
        assert "".join(stream_chat(model, [user("x")])[0]) == "replaced"


def test_without_control_no_one_can_read_the_log_or_replace_the_script():
    """The offline demo is reachable from every sandbox on the host: other users' prompts
    are not kept, and nobody can steer the script."""
    with ScriptedModel({"fallback": "the script"}, max_log=0, control=False) as model:
        root = model.base_url.removesuffix("/v1")
        assert "".join(stream_chat(model, [user("my private prompt")])[0]) == "the script"
        assert http_get(root + "/_log")[0] == 404
        assert model.log == []  # nothing kept in memory either
        for method in ("POST", "DELETE"):
            path = "/_script" if method == "POST" else "/_log"
            request = urllib.request.Request(  # noqa: S310 - loopback
                root + path, method=method, data=json.dumps(["steered"]).encode()
            )
            with pytest.raises(urllib.error.HTTPError) as refused:
                urllib.request.urlopen(request)  # noqa: S310 - loopback
            assert refused.value.code == 404
        assert "".join(stream_chat(model, [user("again")])[0]) == "the script"


def test_bad_scripts_are_refused_with_the_place_named():
    with pytest.raises(ScriptError, match=r"responses\[0\]: unknown step keys"):
        Script.parse([{"txt": "typo"}])
    with pytest.raises(ScriptError, match=r"rules\[0\]: bad regex"):
        Script.parse({"rules": [{"match": "(", "responses": []}]})
    with pytest.raises(ScriptError, match=r"rules\[0\]: unknown rule keys \['unles_tool'\]"):
        Script.parse({"rules": [{"match": "x", "unles_tool": "run_python", "responses": []}]})
    with pytest.raises(ScriptError, match=r"rules\[0\].when_system: bad regex"):
        Script.parse({"rules": [{"match": "x", "when_system": "(", "responses": []}]})
    with pytest.raises(ScriptError, match=r"rules\[0\].when_tool: a tool name or a list"):
        Script.parse({"rules": [{"match": "x", "when_tool": [1], "responses": []}]})
    with pytest.raises(ScriptError, match="not valid JSON"):
        Script.parse("{")


def test_command_line_serves_the_bundled_demo_script_until_sigterm():
    port = free_port()
    command = [PYTHON, "-m", "scripted_model", "--script", "demo", "--port", str(port)]
    with child_process(command) as process:
        wait_http(f"http://127.0.0.1:{port}/v1/models", process=process, timeout=30)
        response = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x").models.list()
        assert [m.id for m in response] == ["scripted-demo"]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    assert f"http://127.0.0.1:{port}/v1" in output_of(process)


def test_demo_script_code_makes_the_spreadsheet_and_chart_from_tips_csv(tmp_path):
    """The demo's run_python code is real: run it on the sample data and read the outputs."""
    import openpyxl

    demo = Script.load("demo")
    turn = [user("average tip by day, as a spreadsheet and a chart")]
    step = demo.choose({"messages": turn, "tools": TOOLS}).step
    code = step["tool_calls"][0]["arguments"]["code"]
    shutil.copy(ROOT / "sample_data" / "tips.csv", tmp_path / "tips.csv")
    done = subprocess.run(
        [PYTHON, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={"MPLBACKEND": "Agg", "PATH": "/usr/bin:/bin"},
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "| Sun | 3.26 | 76 |" in done.stdout
    sheet = openpyxl.load_workbook(tmp_path / "summary.xlsx")["Average tip by day"]
    rows = {row[0]: row[1] for row in sheet.iter_rows(min_row=2, values_only=True)}
    assert rows == {"Thur": 2.77, "Fri": 2.73, "Sat": 2.99, "Sun": 3.26}
    assert (tmp_path / "chart.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_tool_arguments_can_quote_the_latest_tool_result_as_json():
    """``{{tool_result_json}}`` in a string argument: the latest tool result as a JSON
    string literal (so code can work on it, quotes and newlines included)."""
    code = "rows = {{tool_result_json}}\nprint(rows)"
    script = {
        "responses": [{"tool_calls": [{"name": "run_python", "arguments": {"code": code, "n": 1}}]}]
    }
    call = {"id": "c1", "type": "function", "function": {"name": "run_sql", "arguments": "{}"}}
    result = '| day | "n" |\n|---|---|\n| Sun | 76 |'
    messages = [
        user("count"),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]
    with ScriptedModel(script) as model:
        answer = client(model).chat.completions.create(model="m", messages=messages, tools=TOOLS)
    arguments = json.loads(answer.choices[0].message.tool_calls[0].function.arguments)
    assert arguments["n"] == 1
    assert arguments["code"] == f"rows = {json.dumps(result)}\nprint(rows)"
    namespace: dict = {}
    exec(arguments["code"].split("\n")[0], namespace)  # noqa: S102 - valid Python
    assert namespace["rows"] == result


def test_tool_output_is_the_tool_result_without_the_files_it_names():
    """``{{tool_output}}``: the latest tool result without paw-agent's ``figures saved:``
    and ``files written:`` paragraphs, so an answer that names the files says so once."""
    script = {"responses": ["{{tool_output}}\n\nI saved chart.png.|{{SPLIT}}|{{tool_result}}"]}
    call = {"id": "c1", "type": "function", "function": {"name": "run_python", "arguments": "{}"}}
    result = "| day | tip |\n|---|---|\n| Sun | 3.26 |\n\nfigures saved: f.png\n\nfiles written: chart.png"
    messages = [
        user("tips"),
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": result},
    ]
    with ScriptedModel(script) as model:
        answer = client(model).chat.completions.create(model="m", messages=messages, tools=TOOLS)
    output, whole = answer.choices[0].message.content.split("|{{SPLIT}}|")
    assert output == "| day | tip |\n|---|---|\n| Sun | 3.26 |\n\nI saved chart.png."
    assert whole == result  # {{tool_result}} is the whole result, as before
