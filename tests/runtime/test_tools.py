"""paw-agent's tools on real data and real processes: run_python with pandas, openpyxl and
matplotlib, files, workspace confinement, the approval gate, packages, cancel."""

from __future__ import annotations

import base64
import hashlib
import shutil
import signal
import time
import zipfile
from pathlib import Path

import openpyxl
import pytest

from paw_project.scripted_model import Script
from tests.runtime.driver import notifies, processes_with
from tests.support import ROOT

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
    assert notifies(lines, "tool_start") == [["run_python"]]
    calls = notifies(lines, "tool_calls")
    assert calls[0][0]["name"] == "run_python"
    code_repr = calls[0][0]["args"]["code"]
    assert code_repr.startswith("'import glob") and len(code_repr) <= 100
    # The whole code too, for people to read what ran (the short repr is the protocol's).
    demo_code = Script.load("demo").rules[0].steps[0]["tool_calls"][0]["arguments"]["code"]
    assert calls[0][0]["input"] == {"code": demo_code}
    assert notifies(lines, "tool_running") == ["run_python"]
    assert notifies(lines, "tool") == [
        {"name": "run_python", "ok": True, "summary": "wrote chart.png, summary.xlsx"}
    ]
    assert result["usage"]["rounds"] == 2
    # The Python kernel lives on between runs, and dies with paw-agent.
    assert len(processes_with(runtime.marker)) >= 2
    runtime.send({"op": "shutdown"})
    assert runtime.wait_exit() == 0
    assert wait_gone(runtime.marker, keep=set()) == []


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
    assert notifies(lines, "tool")[0] == {
        "name": "run_python",
        "ok": False,
        "summary": "ZeroDivisionError: division by zero",
    }


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
        {"name": "shell", "ok": False, "summary": "declined by the user"}
    ]
    assert not (workspace / "made.txt").exists()


def test_an_approved_command_runs_once(start, model, workspace):
    model.load(script(call("shell", command="echo once >> count.txt; echo $PAW_TEST_MARKER")))
    runtime = start()
    runtime.ready()
    runtime.send({"op": "submit", "prompt": "count", "run_id": "r1"})
    ask = confirm_prompt(runtime)
    runtime.send({"op": "answer", "run_id": "r1", "answers": ["yes"], "ask_id": ask["ask_id"]})
    assert runtime.run_lines("r1")[-1]["errors"] == []
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
