"""paw-agent's tools on real data and real processes: run_python with pandas, openpyxl and
matplotlib, files, workspace confinement, the approval gate, packages, cancel."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import signal
import time
import zipfile
from pathlib import Path

import openpyxl
import pytest

from paw_agent.tools import MAX_OUTPUT
from scripted_model import Script
from tests.paw_agent.driver import notifies, processes_with
from tests.processes import ROOT

PNG = b"\x89PNG\r\n\x1a\n"


def call(name: str, **arguments) -> dict:
    """A scripted step calling one tool."""
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def script(*responses, fallback="All done."):
    return {"api_key": "sk-runtime-test", "responses": list(responses), "fallback": fallback}


def tool_results(model) -> list[str]:
    """The tool messages of the last request the model received, in order."""
    return [m["content"] for m in model.requests[-1]["messages"] if m["role"] == "tool"]


def wait_gone(marker: str, keep: set[int], timeout: float = 10.0) -> list[int]:
    """PIDs still carrying ``marker`` (other than ``keep``) once they are gone or after
    ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        left = [pid for pid in processes_with(marker) if pid not in keep]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def confirm_prompt(runtime) -> dict:
    return runtime.wait_for(lambda x: x.get("kind") == "ask")["data"]


def test_average_tip_by_day_becomes_a_spreadsheet_and_a_chart(start, model, workspace):
    shutil.copy(ROOT / "sample_data" / "tips.csv", workspace / "tips.csv")
    model.load(Script.load("demo"))
    runtime = start()
    runtime.ready()
    lines = runtime.submit("average tip by day, as a spreadsheet and a chart", timeout=120)
    result = lines[-1]
    assert result["errors"] == [], result
    sheet = openpyxl.load_workbook(workspace / "summary.xlsx")["Average tip by day"]
    rows = {row[0]: row[1] for row in sheet.iter_rows(min_row=2, values_only=True)}
    assert rows == {"Thur": 2.77, "Fri": 2.73, "Sat": 2.99, "Sun": 3.26}
    chart = (workspace / "chart.png").read_bytes()
    assert chart.startswith(PNG) and len(chart) > 5000
    assert "| Sun | 3.26 | 76 |" in result["answer"]
    # The files are named once, by the answer's sentence (not by the tool's files line too).
    assert "files written" not in result["answer"]
    assert result["answer"].count("summary.xlsx") == 1 and result["answer"].count("chart.png") == 1
    assert notifies(lines, "tool_start") == [["run_python"]]
    calls = notifies(lines, "tool_calls")
    assert calls[0][0]["name"] == "run_python"
    code_repr = calls[0][0]["args"]["code"]
    assert code_repr.startswith("'import glob") and len(code_repr) <= 100
    # The whole code too, for people to read what ran (the short repr is the protocol's).
    tips_rule = next(r for r in Script.load("demo").rules if r.when_tool == ("run_python",))
    demo_code = tips_rule.steps[0]["tool_calls"][0]["arguments"]["code"]
    assert calls[0][0]["input"] == {"code": demo_code}
    assert notifies(lines, "tool_running") == ["run_python"]
    (tool,) = notifies(lines, "tool")
    assert {k: tool[k] for k in ("name", "ok", "summary")} == {
        "name": "run_python",
        "ok": True,
        "summary": "wrote chart.png, summary.xlsx",
    }
    # What the person sees of it (tool_output): the printed table, and the files it wrote.
    assert "| Sun | 3.26 | 76 |" in tool["output"]["stdout"]
    assert tool["output"]["error"] is None
    assert tool["files"] == ["chart.png", "summary.xlsx"]
    assert result["usage"]["rounds"] == 2
    # The Python kernel lives on between runs, and dies with paw-agent.
    assert len(processes_with(runtime.marker)) >= 2
    runtime.send({"op": "shutdown"})
    assert runtime.wait_exit() == 0
    assert wait_gone(runtime.marker, keep=set()) == []


def test_the_demos_sql_question_without_its_datasource_says_how_to_give_it(start, model):
    """Asked of a run without datasources (no run_sql offered), the demo's SQL rule does
    not apply, and the tips-by-day CSV rule must not run on a workspace without a CSV."""
    model.load(Script.load("demo"))
    runtime = start()
    runtime.ready()
    lines = runtime.submit("average tip by day from the database", timeout=60)
    assert notifies(lines, "tool_calls") == []
    assert "tick **Tips (demo)** under *Data*" in lines[-1]["answer"]


def test_variables_persist_and_unsaved_figures_are_saved_as_png(start, model, workspace):
    model.load(
        script(
            call("run_python", code="import matplotlib.pyplot as plt\nx = 41\nplt.plot([1, 3, 2])"),
            call("run_python", code="x + 1"),
        )
    )
    runtime = start()
    runtime.ready()
    result = runtime.submit("plot", timeout=120)[-1]
    assert result["errors"] == []
    first, second = tool_results(model)
    assert "figures saved: figure_1.png" in first
    assert second == "42"
    assert (workspace / "figure_1.png").read_bytes().startswith(PNG)


def test_a_traceback_goes_back_to_the_model_and_the_session_survives(start, model):
    model.load(script(call("run_python", code="y = 5\n1 / 0"), call("run_python", code="y")))
    runtime = start()
    runtime.ready()
    lines = runtime.submit("divide", timeout=120)
    failed, survived = tool_results(model)
    assert "Traceback" in failed and "ZeroDivisionError: division by zero" in failed
    assert "kernel.py" not in failed
    assert survived == "5"
    tool = notifies(lines, "tool")[0]
    assert {k: tool[k] for k in ("name", "ok", "summary")} == {
        "name": "run_python",
        "ok": False,
        "summary": "ZeroDivisionError: division by zero",
    }
    assert tool["output"]["error"].endswith("ZeroDivisionError: division by zero\n")
    assert "kernel.py" not in tool["output"]["error"]


def test_the_tools_output_goes_to_people_capped(start, model):
    """notify tool "output" (tool_output): stdout, stderr and error apart, each cut at
    MAX_OUTPUT characters with its middle left out; other tools' text as their stdout."""
    model.load(
        script(
            call(
                "run_python",
                code="import sys\nprint('head' + 'x' * 30000 + 'tail')\n"
                "print('warned', file=sys.stderr)",
            ),
            call("list_files"),
        )
    )
    runtime = start()
    runtime.ready()
    lines = runtime.submit("print a lot", timeout=120)
    python, listing = notifies(lines, "tool")
    out = python["output"]
    assert out["stdout"].startswith("headxxx") and out["stdout"].rstrip().endswith("xxxtail")
    assert "characters omitted" in out["stdout"]
    assert len(out["stdout"]) < MAX_OUTPUT + 100
    assert out["stderr"] == "warned\n" and out["error"] is None
    assert python["files"] == [] and "table" not in python
    assert listing["output"] == {"stdout": "(empty folder)", "stderr": "", "error": None}


def test_a_dataframe_result_comes_back_as_a_table(start, model):
    code = (
        "import pandas as pd\n"
        "frame = pd.DataFrame({'day': ['Thur', 'Fri'] * 80, 'tip': [1.5, float('nan')] * 80,"
        " 'when': pd.to_datetime(['2024-01-02'] * 160)})\n"
        "frame"
    )
    grouped = "frame.groupby('day')['tip'].count()"
    model.load(script(call("run_python", code=code), call("run_python", code=grouped)))
    runtime = start()
    runtime.ready()
    lines = runtime.submit("show the frame", timeout=120)
    first, second = notifies(lines, "tool")
    table = first["table"]
    assert table["columns"] == ["day", "tip", "when"]
    assert table["row_count"] == 160 and table["truncated"] is True
    assert len(table["rows"]) == 100
    assert table["rows"][:2] == [
        ["Thur", 1.5, "2024-01-02T00:00:00"],
        ["Fri", None, "2024-01-02T00:00:00"],
    ]
    # The model still reads the DataFrame's text, as before.
    assert "[160 rows x 3 columns]" in tool_results(model)[0]
    assert first["output"]["stdout"] == ""  # people get the table instead of its text
    # A Series with a named index: the index is the first column.
    assert second["table"] == {
        "columns": ["day", "tip"],
        "rows": [["Fri", 0], ["Thur", 80]],
        "row_count": 2,
        "truncated": False,
    }


def test_plotly_figures_are_saved_as_plotly_json_like_matplotlib_figures(start, model, workspace):
    """fig.show(), a figure as the final expression, and one kept in a new variable are
    written as figure_N.plotly.json; one the code wrote itself is not written again."""
    model.load(
        script(
            call(
                "run_python",
                code="import plotly.express as px\n"
                "shown = px.bar(x=['Thur', 'Fri'], y=[2.77, 2.73])\nshown.show()\n"
                "kept = px.line(x=[1, 2], y=[3, 4])\n"
                "mine = px.scatter(x=[1], y=[1])\nmine.write_json('mine.plotly.json')",
            ),
            call("run_python", code="px.bar(x=['a'], y=[1])"),
            call("run_python", code="print(len(kept.data))"),
        )
    )
    runtime = start()
    runtime.ready()
    lines = runtime.submit("plot", timeout=120)
    first, second, third = notifies(lines, "tool")
    assert first["ok"], first
    assert first["files"] == [
        "figure_1.plotly.json", "figure_1.png", "figure_2.plotly.json", "figure_2.png",
        "mine.plotly.json",
    ]  # fmt: skip
    # Each saved figure's picture, the page's fallback: a real PNG of the chart.
    assert (workspace / "figure_1.png").read_bytes().startswith(PNG)
    assert not (workspace / "mine.png").exists()  # the code wrote that one itself
    shown = json.loads((workspace / "figure_1.plotly.json").read_text())
    assert shown["data"][0]["type"] == "bar" and list(shown["data"][0]["x"]) == ["Thur", "Fri"]
    assert "layout" in shown
    assert (
        json.loads((workspace / "figure_2.plotly.json").read_text())["data"][0]["mode"] == "lines"
    )
    assert (
        "figures saved: figure_1.plotly.json, figure_1.png, figure_2.plotly.json, figure_2.png"
        in tool_results(model)[0]
    )
    assert second["files"] == ["figure_3.plotly.json", "figure_3.png"]
    assert third["files"] == []  # an unchanged variable is not saved again


def test_run_python_time_limit_stops_the_code_and_the_run_goes_on(start, model):
    model.load(
        script(
            call("run_python", code="import time\ntime.sleep(120)"),
            call("run_python", code="print('fresh')"),
        )
    )
    runtime = start("paw-agent", "--tool-timeout", "1")
    runtime.ready()
    result = runtime.submit("sleep", timeout=60)[-1]
    timed_out, fresh = tool_results(model)
    assert "ran longer than 1 s" in timed_out and "restarted" in timed_out
    assert fresh == "fresh"
    assert result["answer"] == "All done."


def test_a_spreadsheet_is_read_as_a_pandas_preview(start, model, workspace):
    book = openpyxl.Workbook()
    sheet = book.active
    sheet.append(["day", "average tip"])
    for day, tip in [("Thur", 2.77), ("Fri", 2.73), ("Sat", 2.99)]:
        sheet.append([day, tip])
    book.save(workspace / "summary.xlsx")
    model.load(script(call("read_file", path="summary.xlsx")))
    runtime = start()
    runtime.ready()
    runtime.submit("read it", timeout=120)
    [preview] = tool_results(model)
    assert preview.startswith("sheet 'Sheet': 3 rows x 2 columns"), preview
    assert "average tip (float64)" in preview and "Sat" in preview and "2.99" in preview


def test_files_are_listed_read_as_previews_and_written(start, model, workspace):
    shutil.copy(ROOT / "sample_data" / "tips.csv", workspace / "tips.csv")
    (workspace / "notes").mkdir()
    (workspace / "notes" / "todo.txt").write_text("check the tips\n")
    model.load(
        script(
            call("write_file", path="out/report.md", content="# Report\nok\n"),
            call("list_files", path=".", recursive=True),
            call("read_file", path="tips.csv"),
            call("read_file", path="notes/todo.txt"),
        )
    )
    runtime = start()
    runtime.ready()
    runtime.submit("files", timeout=120)
    written, listing, preview, text = tool_results(model)
    assert written == "wrote 12 bytes to out/report.md"
    assert (workspace / "out" / "report.md").read_text() == "# Report\nok\n"
    assert listing.splitlines() == [
        "notes/",
        "out/",
        "tips.csv  (9.5 KB)",
        "notes/todo.txt  (15 bytes)",
        "out/report.md  (12 bytes)",
    ]
    assert preview.startswith("244 rows x 7 columns")
    assert "total_bill (float64)" in preview and "Sun" in preview
    assert text == "check the tips\n"


def test_paths_leaving_the_workspace_are_refused(start, model, workspace, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret")
    (workspace / "link").symlink_to(outside)
    model.load(
        script(
            call("read_file", path="../outside/secret.txt"),
            call("read_file", path="/etc/passwd"),
            call("read_file", path="link/secret.txt"),
            call("write_file", path="../escape.txt", content="x"),
            call("write_file", path="link/new.txt", content="x"),
            call("list_files", path="/"),
            call("delete_file", path="link/secret.txt"),
            call("list_files", path=".", recursive=True),
        )
    )
    runtime = start()
    runtime.ready()
    lines = runtime.submit("escape", timeout=60)
    *results, listing = tool_results(model)
    assert len(results) == 7
    assert all(r.startswith("error: refused") for r in results), results
    assert listing == "link  (symlink)"  # listed, never followed
    assert "'..' is not allowed" in results[0]
    assert "absolute paths are not allowed" in results[1]
    assert "outside the workspace" in results[2]
    assert "top secret" not in "".join(results)
    assert not (tmp_path / "escape.txt").exists() and not (outside / "new.txt").exists()
    assert (outside / "secret.txt").exists()
    assert [t["ok"] for t in notifies(lines, "tool")] == [False] * 7 + [True]
    assert notifies(lines, "ask") == []  # refused before any approval was asked


def test_a_declined_command_does_not_run(start, model, workspace):
    model.load(script(call("shell", command="echo made > made.txt")))
    runtime = start()
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "make a file", "run_id": "r1"})
    ask = confirm_prompt(runtime)
    assert ask["kind"] == "confirm"
    assert ask["prompt"].endswith("\necho made > made.txt")
    runtime.send({"op": "answer", "run_id": "r1", "answers": ["no"], "ask_id": ask["ask_id"]})
    lines = runtime.run_lines("r1")
    assert tool_results(model) == ["declined by the user"]
    assert notifies(lines, "tool") == [
        {
            "name": "shell",
            "ok": False,
            "summary": "declined by the user",
            "output": {"stdout": "", "stderr": "", "error": "declined by the user"},
        }
    ]
    assert not (workspace / "made.txt").exists()


def test_an_approved_command_runs_once(start, model, workspace):
    model.load(script(call("shell", command="echo once >> count.txt; echo $PAW_TEST_MARKER")))
    runtime = start()
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "count", "run_id": "r1"})
    ask = confirm_prompt(runtime)
    runtime.send({"op": "answer", "run_id": "r1", "answers": ["yes"], "ask_id": ask["ask_id"]})
    lines = runtime.run_lines("r1")
    assert lines[-1]["errors"] == []
    # The confirm named the very call its tool_calls line then announced (a host holds
    # the approval to it).
    command = "echo once >> count.txt; echo $PAW_TEST_MARKER"
    assert ask["call"] == {
        "name": "shell",
        "args": {"command": repr(command)},
        "input": {"command": command},
    }
    assert notifies(lines, "tool_calls") == [[ask["call"]]]
    assert (workspace / "count.txt").read_text() == "once\n"
    assert tool_results(model) == [f"exit code 0\n{runtime.marker}"]


def test_an_unanswered_approval_is_declined_after_the_answer_timeout(start, model, workspace):
    model.load(script(call("delete_file", path="keep.txt")))
    (workspace / "keep.txt").write_text("keep me")
    runtime = start("paw-agent", "--answer-timeout", "0.5")
    runtime.ready()
    lines = runtime.submit("delete", timeout=30)
    assert notifies(lines, "ask")[0]["prompt"] == "delete_file: delete the file keep.txt (7 bytes)"
    assert tool_results(model) == ["declined by the user"]
    assert (workspace / "keep.txt").exists()


def test_cancel_during_a_pending_approval_ends_the_run_without_acting(start, model, workspace):
    model.load(script(call("shell", command="echo made > made.txt")))
    runtime = start()
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "make a file", "run_id": "r1"})
    confirm_prompt(runtime)
    runtime.send({"op": "cancel", "run_id": "r1"})
    result = runtime.wait_for(lambda x: x["type"] == "result", timeout=10)
    assert result["cancelled"] is True
    assert not (workspace / "made.txt").exists()
    assert len(model.requests) == 1  # the model was not asked again


def test_cancel_kills_the_running_commands_whole_process_group(start, model):
    model.load(script(call("shell", command="sleep 300 & sleep 301")))
    runtime = start()
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "sleep", "run_id": "r1"})
    ask = confirm_prompt(runtime)
    runtime.send({"op": "answer", "run_id": "r1", "answers": ["y"], "ask_id": ask["ask_id"]})
    deadline = time.monotonic() + 10
    while len(processes_with(runtime.marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)  # paw-agent, the guard, bash and the sleeps
    assert len(processes_with(runtime.marker)) >= 3
    runtime.send({"op": "cancel", "run_id": "r1"})
    result = runtime.wait_for(lambda x: x["type"] == "result", timeout=10)
    assert result["cancelled"] is True
    assert wait_gone(runtime.marker, keep={runtime.pid}) == []


def test_cancel_kills_running_python_and_its_children(start, model):
    code = "import subprocess, time\nsubprocess.Popen(['sleep', '302'])\ntime.sleep(300)"
    model.load(script(call("run_python", code=code)))
    runtime = start()
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "sleep", "run_id": "r1"})
    runtime.wait_for(lambda x: x.get("kind") == "tool_running")
    deadline = time.monotonic() + 30
    while len(processes_with(runtime.marker)) < 3 and time.monotonic() < deadline:
        time.sleep(0.05)  # paw-agent, the kernel, the sleep
    runtime.send({"op": "cancel", "run_id": "r1"})
    assert runtime.wait_for(lambda x: x["type"] == "result", timeout=10)["cancelled"] is True
    assert wait_gone(runtime.marker, keep={runtime.pid}) == []


def processes_with_argument(argument: str) -> list[int]:
    """Live processes (not zombies) with ``argument`` among their arguments: found by
    command line, since the detached ones cleared their environment (no marker)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if argument.encode() in arguments and state != "Z":
            found.append(int(entry.name))
    return found


def line_count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


#: A run_python call leaving two writers behind, each appending a line a second: a Popen
#: of a shell loop (in the kernel's process group), and one in a session of its own with
#: an empty environment (no group kill, no environment marker reaches it).
BACKGROUND_WRITERS = """
import subprocess
loop = 'while :; do echo x >> "$0"; sleep 1; done'
subprocess.Popen(['sh', '-c', loop, 'bg.txt'])
subprocess.Popen(['setsid', 'env', '-i', 'sh', '-c', loop, 'detached.txt', TOKEN],
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print('started')
"""


@pytest.mark.parametrize("reason", ["cancel", "timeout"])
def test_a_stopped_run_stops_its_background_writers_within_a_second(
    start, model, workspace, reason
):
    token = f"paw-writer-{time.monotonic_ns()}"
    code = f"TOKEN = {token!r}\n{BACKGROUND_WRITERS}"
    story = {"text": "z" * 4000, "chunk": 2, "chunk_delay": 0.05}
    model.load(script(call("run_python", code=code), story, fallback="Hello again."))
    runtime = start("paw-agent", *(["--timeout", "6"] if reason == "timeout" else []))
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "write in the background", "run_id": "r1"})
    runtime.wait_for(lambda x: x.get("type") == "delta", timeout=30)
    deadline = time.monotonic() + 10
    while (line_count(workspace / "bg.txt") < 2 or line_count(workspace / "detached.txt") < 2) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.05)
    assert processes_with_argument(token), "the detached writer runs"
    if reason == "cancel":
        runtime.send({"op": "cancel", "run_id": "r1"})
        stopped = time.monotonic()
    result = runtime.wait_for(lambda x: x["type"] == "result", timeout=20)
    if reason == "timeout":
        stopped = time.monotonic()  # the runtime's own deadline: its result says when
        assert [e["code"] for e in result["errors"]] == ["timeout"], result
    assert result["cancelled"] is (reason == "cancel"), result
    time.sleep(max(0.0, stopped + 1.0 - time.monotonic()))  # one second after the stop
    counts = line_count(workspace / "bg.txt"), line_count(workspace / "detached.txt")
    time.sleep(2.5)  # long enough for two more lines of a writer still going
    assert (line_count(workspace / "bg.txt"), line_count(workspace / "detached.txt")) == counts
    assert processes_with_argument(token) == []
    assert wait_gone(runtime.marker, keep={runtime.pid}, timeout=0) == []
    # The runtime itself stays up for the next turn, with a fresh Python kernel.
    lines = runtime.submit("hello", run_id="r2", timeout=30)
    assert lines[-1]["errors"] == [] and lines[-1]["answer"] == "Hello again."


def test_no_tool_process_outlives_a_killed_paw_agent(start, model):
    model.load(
        script(
            call("run_python", code="import subprocess\nsubprocess.Popen(['sleep', '303'])"),
            call("shell", command="sleep 304"),
        )
    )
    runtime = start()
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "sleep", "run_id": "r1"})
    ask = confirm_prompt(runtime)  # the kernel and its sleep are running by now
    runtime.send({"op": "answer", "run_id": "r1", "answers": ["yes"], "ask_id": ask["ask_id"]})
    deadline = time.monotonic() + 10
    while len(processes_with(runtime.marker)) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(processes_with(runtime.marker)) >= 5  # agent, kernel, sleep, guard, sleep
    runtime.process.send_signal(signal.SIGKILL)  # no chance to clean up
    runtime.wait_exit()
    left = wait_gone(runtime.marker, keep=set())
    assert left == [], [Path(f"/proc/{pid}/cmdline").read_bytes() for pid in left]


def make_wheel(folder: Path, name: str = "pawtestpkg", version: str = "0.1") -> Path:
    """A minimal pure-Python wheel (PEP 427) built by hand, so no index is needed."""
    files = {
        f"{name}/__init__.py": "VALUE = 'installed-ok'\n",
        f"{name}-{version}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{name}-{version}.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, text in files.items():
            archive.writestr(path, text)
    return wheel


@pytest.mark.parametrize("approve", [True, False], ids=["approved", "declined"])
def test_install_package_into_the_private_folder_for_run_python(start, model, workspace, approve):
    make_wheel(workspace)
    model.load(
        script(
            call("install_package", package="pawtestpkg-0.1-py3-none-any.whl"),
            call("run_python", code="import pawtestpkg\nprint(pawtestpkg.VALUE)"),
        )
    )
    runtime = start()
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "install", "run_id": "r1"})
    ask = confirm_prompt(runtime)
    assert ask["prompt"] == (
        "install_package: pip install --target .paw/site-packages pawtestpkg-0.1-py3-none-any.whl"
    )
    runtime.send(
        {
            "op": "answer",
            "run_id": "r1",
            "answers": ["yes" if approve else "no"],
            "ask_id": ask["ask_id"],
        }
    )
    runtime.run_lines("r1", timeout=180)
    installed, imported = tool_results(model)
    target = workspace / ".paw" / "site-packages" / "pawtestpkg" / "__init__.py"
    if approve:
        assert "Successfully installed pawtestpkg-0.1" in installed
        assert imported == "installed-ok"
        assert target.exists()
    else:
        assert installed == "declined by the user"
        assert "ModuleNotFoundError: No module named 'pawtestpkg'" in imported
        assert not target.exists()


def test_install_package_refuses_options_and_urls(start, model):
    model.load(
        script(
            call("install_package", package="--index-url http://evil/ x"),
            call("install_package", package="x @ https://evil/x.whl"),
        )
    )
    runtime = start()
    runtime.ready()
    lines = runtime.submit("install", timeout=30)
    assert tool_results(model) == [
        "error: '--index-url http://evil/ x' is not a package requirement (name, optional "
        "extras and version) nor a wheel file in the workspace",
        "error: 'x @ https://evil/x.whl' is not a package requirement (name, optional "
        "extras and version) nor a wheel file in the workspace",
    ]
    assert notifies(lines, "ask") == []


def test_ask_user_question_and_its_answer_timeout(start, model):
    model.load(
        script(
            call("ask_user", question="Which sheet?", options=["A", "B"]),
            call("ask_user", question="Anything else?"),
        )
    )
    runtime = start("paw-agent", "--answer-timeout", "1")
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "ask", "run_id": "r1"})
    ask = runtime.wait_for(lambda x: x.get("kind") == "ask")["data"]
    assert ask["questions"] == [{"question": "Which sheet?", "options": ["A", "B"]}]
    runtime.send({"op": "answer", "run_id": "r1", "answers": ["B", "A"], "ask_id": ask["ask_id"]})
    runtime.run_lines("r1", timeout=30)
    assert tool_results(model) == ["the user answered: B, A", "the user did not answer in time"]


def test_update_plan_shows_the_steps_as_todos_and_refuses_a_bad_plan(start, model):
    steps = [
        {"content": "Load tips.csv", "status": "completed"},
        {"content": "Average the tips by day", "status": "in_progress"},
        {"content": "Write summary.xlsx", "status": "pending"},
    ]
    model.load(
        script(
            call("update_plan", steps=steps),
            call("update_plan", steps=[{"content": "x", "status": "maybe"}]),
            call("update_plan", steps=[]),
        )
    )
    runtime = start()
    runtime.ready()
    lines = runtime.submit("plan", timeout=30)
    assert notifies(lines, "todos") == [steps]  # only the valid plan reaches the host
    assert tool_results(model) == [
        "plan shown to the user (1 of 3 steps done)",
        "error: a step's status is one of pending, in_progress, completed",
        "error: steps must be a non-empty list",
    ]
