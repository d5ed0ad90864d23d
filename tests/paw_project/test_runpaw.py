"""`manage.py runpaw` (what `make run` starts): embedded mode and Redis mode."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

import openpyxl
import pytest
from django.conf import settings

from tests.paw_project.test_health import probe_concurrently
from tests.processes import (
    PYTHON,
    ROOT,
    child_process,
    free_port,
    http_get,
    output_of,
    wait_http,
    worker_database_url,
)
from tests.sandboxes.observe import process_alive, process_command_line

pytestmark = pytest.mark.slow


def _children_of(pid: int) -> list[int]:
    result = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    )
    return [int(p) for p in result.stdout.split()]


def _is_spare(pid: int) -> bool:
    """Whether ``pid`` is a spare runtime (``paw-agent serve --spare``, in its jail)."""
    return "--spare" in process_command_line(pid)


@pytest.fixture(scope="module")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated SQLite database to copy (migrating takes seconds; copying does not)."""
    path = tmp_path_factory.mktemp("sqlite") / "paw.sqlite3"
    subprocess.run(
        [PYTHON, "manage.py", "migrate", "--noinput", "-v0"],
        cwd=ROOT,
        env={**os.environ, **embedded_env(path.parent, path)},
        check=True,
        timeout=120,
    )
    return path


def embedded_env(var_dir: Path, database: Path, port: int | None = None) -> dict[str, str]:
    env = {
        "PAW_REDIS_URL": "",
        "PAW_DATABASE_URL": f"sqlite:///{database}",
        "PAW_VAR_DIR": str(var_dir),
    }
    if port is not None:
        env["PAW_PORT"] = str(port)
    return env


def embedded_paw(tmp_path: Path, migrated_sqlite: Path, *, var_dir: Path | None = None):
    """``runpaw`` in embedded mode on a copy of the migrated database; ``(process, port)``."""
    database = tmp_path / "db" / "paw.sqlite3"
    database.parent.mkdir(exist_ok=True)
    shutil.copy(migrated_sqlite, database)
    port = free_port()
    env = embedded_env(var_dir or tmp_path / "var", database, port)
    return child_process([PYTHON, "manage.py", "runpaw"], env=env, stop_signal=signal.SIGINT), port


def test_embedded_mode_serves_health_readiness_and_admin_in_one_process(tmp_path, migrated_sqlite):
    process, port = embedded_paw(tmp_path, migrated_sqlite)
    with process as paw:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", process=paw)
        status, body, _ = http_get(f"{base}/readyz", timeout=15)
        assert status == 200, body
        assert json.loads(body)["checks"]["worker"] == "ok"
        # The worker is the thread next door: concurrent probes all see it (no broadcast
        # ping whose replies some probes missed).
        results = probe_concurrently(f"{base}/readyz", 30)
        assert [status for status, _ in results] == [200] * 30, results
        status, body, _ = http_get(f"{base}/admin/login/")
        assert status == 200 and b"Django administration" in body
        assert http_get(f"{base}/static/admin/css/base.css")[0] == 200
        # Everything runs in one process: its only child is the node's spare runtime
        # (PAW_SANDBOX_SPARES, 1), a paw-agent waiting for a new conversation.
        deadline = time.monotonic() + 60
        while not (spares := _children_of(paw.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert [_is_spare(pid) for pid in spares] == [True], spares
        paw.send_signal(signal.SIGINT)
        assert paw.wait(timeout=30) == 0, output_of(paw)
        assert not [pid for pid in spares if process_alive(pid)]  # stopped with it
    output = output_of(paw)
    assert "embedded" in output
    assert f"http://127.0.0.1:{port}/" in output
    assert re.search(r'INFO paw\.access \[\w{32}\] \S+ "GET /admin/login/ HTTP/1.1" 200 ', output)
    assert output.rstrip().endswith("PAW stopped."), output


def _run_to_end(base: str, api: str, prompt: dict, token: str, paw) -> dict:
    """Start the run ``prompt`` in the conversation at ``api`` and poll it until it ends
    (at most 120 s; ``paw``'s output in the failure)."""
    status, run = _call(base, "POST", f"{api}/runs", prompt, token)
    assert status == 202, run
    return _wait_for_end(base, api, run, token, paw)


def _wait_for_end(base: str, api: str, run: dict, token: str, paw) -> dict:
    """Poll the started ``run`` of the conversation at ``api`` until it ends (at most
    120 s; ``paw``'s output in the failure)."""
    deadline = time.monotonic() + 120
    while run["status"] not in ("done", "error", "cancelled"):
        assert time.monotonic() < deadline, f"the run did not finish: {run}\n{output_of(paw)}"
        time.sleep(0.3)
        run = _call(base, "GET", f"{api}/runs/{run['id']}", token=token)[1]
    return run


def _call(base: str, method: str, path: str, body=None, token: str = "", content_type=None):
    """``(status, parsed JSON or raw bytes)`` of one API call to a PAW process."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = body
    if isinstance(body, dict):
        data, content_type = json.dumps(body).encode(), "application/json"
    if content_type:
        headers["Content-Type"] = content_type
    request = urllib.request.Request(base + path, data=data, headers=headers, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            status, raw, kind = (
                response.status,
                response.read(),
                response.headers.get_content_type(),
            )
    except urllib.error.HTTPError as error:
        status, raw, kind = error.code, error.read(), error.headers.get_content_type()
    return status, json.loads(raw) if kind == "application/json" else raw


def test_embedded_paw_does_the_offline_demo_end_to_end(tmp_path, migrated_sqlite):
    """The main job the way `make run` starts PAW, with no API key anywhere: the scripted
    demo is the only active provider, and the real paw-agent turns tips.csv into
    summary.xlsx and chart.png with pandas and matplotlib."""
    from tests.conversations.multipart import MULTIPART, multipart

    process, port = embedded_paw(tmp_path, migrated_sqlite)
    with process as paw:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", process=paw)
        account = {"username": "newcomer", "password": "a long passphrase 42"}
        assert _call(base, "POST", "/api/auth/register", account)[0] == 201
        status, tokens = _call(base, "POST", "/api/auth/token", account)
        assert status == 200, tokens
        token = tokens["access"]
        _, providers = _call(base, "GET", "/api/providers", token=token)
        active = [p for p in providers["providers"] if p["active"]]
        assert [(p["name"], p["label"]) for p in active] == [("demo", "Scripted demo (no AI)")]

        _, conversation = _call(base, "POST", "/api/conversations", {}, token)
        api = f"/api/conversations/{conversation['id']}"
        tips = (ROOT / "sample_data" / "tips.csv").read_bytes()
        status, uploaded = _call(
            base, "POST", f"{api}/files", multipart("tips.csv", tips), token, MULTIPART
        )
        assert status == 201, uploaded
        prompt = {"prompt": "average tip by day, as a spreadsheet and a chart"}
        run = _run_to_end(base, api, prompt, token, paw)
        assert run["status"] == "done", (run, output_of(paw))
        assert run["provider"] == "demo"
        assert "| Sun | 3.26 | 76 |" in run["answer"]
        assert "<table>" in run["answer_html"]

        _, artifacts = _call(base, "GET", f"{api}/artifacts", token=token)
        assert {"summary.xlsx", "chart.png"} <= {a["path"] for a in artifacts["results"]}
        status, chart = _call(base, "GET", f"{api}/artifacts/chart.png", token=token)
        assert status == 200 and chart.startswith(b"\x89PNG\r\n\x1a\n")
        status, xlsx = _call(base, "GET", f"{api}/artifacts/summary.xlsx", token=token)
        assert status == 200
        sheet = openpyxl.load_workbook(io.BytesIO(xlsx))["Average tip by day"]
        averages = {day: tip for day, tip, _ in sheet.iter_rows(min_row=2, values_only=True)}
        assert averages == {"Thur": 2.77, "Fri": 2.73, "Sat": 2.99, "Sun": 3.26}
        paw.send_signal(signal.SIGINT)
        assert paw.wait(timeout=60) == 0, output_of(paw)
    assert "Offline demo: provider 'demo'" in output_of(paw)
    assert "Lost the admin password? Set a new one with `make changepassword`" in output_of(paw)


def test_embedded_paw_answers_a_sql_question_from_the_demo_datasource(tmp_path, migrated_sqlite):
    """`make run` offers the demo datasource (the tips data set as SQLite in PAW_VAR_DIR);
    with it on the conversation, the scripted demo answers a SQL question with the rows
    (the run's result and a table in the answer) and an interactive chart with its PNG."""
    import csv
    from collections import defaultdict

    process, port = embedded_paw(tmp_path, migrated_sqlite)
    with process as paw:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", process=paw)
        account = {"username": "analyst", "password": "a long passphrase 42"}
        assert _call(base, "POST", "/api/auth/register", account)[0] == 201
        token = _call(base, "POST", "/api/auth/token", account)[1]["access"]
        _, listing = _call(base, "GET", "/api/datasources", token=token)
        assert [(d["slug"], d["name"], d["dialect"]) for d in listing["datasources"]] == [
            ("demo-tips", "Tips (demo)", "sqlite")
        ]
        status, conversation = _call(
            base, "POST", "/api/conversations", {"datasources": ["demo-tips"]}, token
        )
        assert status == 201, conversation
        api = f"/api/conversations/{conversation['id']}"
        prompt = {"prompt": "average tip by day from the database"}
        run = _run_to_end(base, api, prompt, token, paw)
        assert run["status"] == "done", (run, output_of(paw))
        assert run["datasources"] == ["demo-tips"]
        # The rows, as SQLite computed them from the very tips.csv.
        tips = defaultdict(list)
        with (ROOT / "sample_data" / "tips.csv").open(newline="") as handle:
            for row in csv.DictReader(handle):
                tips[row["day"]].append(float(row["tip"]))
        result = run["result"]
        assert result["datasource"] == "demo-tips" and result["columns"] == [
            "day", "bills", "average_tip",
        ]  # fmt: skip
        assert [row[:2] for row in result["rows"]] == [
            [day, len(tips[day])] for day in ("Thur", "Fri", "Sat", "Sun")
        ]
        assert {row[0]: row[2] for row in result["rows"]} == {
            "Thur": 2.77, "Fri": 2.73, "Sat": 2.99, "Sun": 3.26,
        }  # fmt: skip
        assert "| Sun | 3.26 | 76 |" in run["answer"] and "<table>" in run["answer_html"]
        _, artifacts = _call(base, "GET", f"{api}/artifacts", token=token)
        assert {"tips_by_day.plotly.json", "tips_by_day.png"} <= {
            a["path"] for a in artifacts["results"]
        }
        status, chart = _call(base, "GET", f"{api}/artifacts/tips_by_day.plotly.json", token=token)
        assert status == 200 and isinstance(chart, dict)  # application/json, parsed
        figure = chart
        assert figure["data"][0]["type"] == "bar"
        assert list(figure["data"][0]["x"]) == ["Thur", "Fri", "Sat", "Sun"]
        # The person sees the query's rows and the chart at the tool calls.
        events = _call(base, "GET", f"{api}/events?after=0&limit=1000", token=token)[1]
        tools = [
            e["event"]["data"]
            for e in events["events"]
            if e["event"].get("type") == "notify" and e["event"].get("kind") == "tool"
        ]
        assert [t["name"] for t in tools] == ["run_sql", "run_python"]
        assert tools[0]["sql_result"]["row_count"] == 4
        assert tools[1]["files"] == ["tips_by_day.plotly.json", "tips_by_day.png"]

        # The same question by POST /api/sql/ask, a run that may use only the SQL tools:
        # the rows and the statement, no run_python and no chart to point at.
        asked = {"datasource": "demo-tips", "question": prompt["prompt"]}
        status, started = _call(base, "POST", "/api/sql/ask", asked, token)
        assert status == 202, started
        where = f"/api/conversations/{started['conversation_id']}"
        sql_run = _wait_for_end(base, where, started, token, paw)
        assert sql_run["status"] == "done" and sql_run["errors"] == [], (sql_run, output_of(paw))
        assert sql_run["result"]["rows"] == result["rows"]
        assert "| Sun | 76 | 3.26 |" in sql_run["answer"]
        assert sql_run["answer"].endswith(f"```sql\n{result['sql']}\n```"), sql_run["answer"]
        assert "run_python" not in sql_run["answer"] and "chart" not in sql_run["answer"]
        paw.send_signal(signal.SIGINT)
        assert paw.wait(timeout=60) == 0, output_of(paw)
    assert "Demo datasource 'demo-tips'" in output_of(paw)
    assert (tmp_path / "var" / "demo" / "tips.sqlite3").is_file()


def _shell(env: dict[str, str], code: str) -> str:
    """What ``manage.py shell -c code`` prints, against the database of ``env``."""
    result = subprocess.run(
        [PYTHON, "manage.py", "shell", "--no-imports", "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


def test_a_run_left_queued_by_a_stopped_embedded_paw_runs_at_the_next_start(
    tmp_path, migrated_sqlite
):
    """Its task died with the in-memory broker: the next start hands the run over at once,
    not a minute later when the reaper would."""
    process, port = embedded_paw(tmp_path, migrated_sqlite)
    env = embedded_env(tmp_path / "var", tmp_path / "db" / "paw.sqlite3")
    run_id = _shell(
        env,
        "from accounts.models import User\n"
        "from conversations.models import Conversation, Run\n"
        "user = User.objects.create_user('queued', password='a long passphrase 42')\n"
        "conversation = Conversation.objects.create(user=user)\n"
        "print(Run.objects.create(conversation=conversation, user=user, prompt='hello',"
        " provider='demo', model='scripted-demo').id)",
    )
    status = "from conversations.models import Run\nprint(Run.objects.get(id='%s').status)"
    with process as paw:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=paw)
        deadline = time.monotonic() + 30  # well inside the reaper's minute
        while (current := _shell(env, status % run_id)) not in ("done", "error", "cancelled"):
            assert time.monotonic() < deadline, f"still {current}:\n{output_of(paw)}"
            time.sleep(0.5)
        assert current == "done", output_of(paw)
    assert "re-sent 1 run(s) left queued by the previous start" in output_of(paw)


def test_a_second_embedded_paw_on_the_same_var_dir_refuses_to_start(tmp_path, migrated_sqlite):
    process, port = embedded_paw(tmp_path, migrated_sqlite)
    with process as first:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=first)
        second = subprocess.run(
            [PYTHON, "manage.py", "runpaw", "--port", str(free_port())],
            cwd=ROOT,
            env={**os.environ, **embedded_env(tmp_path / "var", tmp_path / "db" / "paw.sqlite3")},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert second.returncode == 1, second
        assert f"Another PAW (pid {first.pid}) is already running" in second.stderr
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200  # the first goes on


def test_embedded_paw_stops_even_when_its_var_dir_disappeared(tmp_path, migrated_sqlite):
    """Beat cannot save its schedule then; stopping used to wait for it forever."""
    process, port = embedded_paw(tmp_path, migrated_sqlite)
    with process as paw:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=paw)
        shutil.rmtree(tmp_path / "var")
        paw.send_signal(signal.SIGINT)
        assert paw.wait(timeout=45) == 0, output_of(paw)
    assert output_of(paw).rstrip().endswith("PAW stopped.")


def test_a_port_in_use_is_refused_at_once_with_exit_code_1(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run(
            [PYTHON, "manage.py", "runpaw"],
            cwd=ROOT,
            env={**os.environ, **embedded_env(tmp_path, tmp_path / "paw.sqlite3", port)},
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 1, result
    assert f"Port {port} on 127.0.0.1 is already in use" in result.stderr
    assert "PAW_PORT=" in result.stderr
    assert "PAW is starting" not in result.stdout  # refused before starting anything


def test_the_check_before_make_run_migrates_finds_a_busy_port_and_a_running_paw(
    tmp_path, migrated_sqlite
):
    """`make run` runs `runpaw --check` before it migrates and creates the administrator
    (whose password is printed once): a busy port or another PAW on the same PAW_VAR_DIR is
    said first; a free one passes and leaves both free."""

    def check(port: int, var: Path) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, "manage.py", "runpaw", "--check"],
            cwd=ROOT,
            env={**os.environ, **embedded_env(var, tmp_path / "check.sqlite3", port)},
            capture_output=True,
            text=True,
            timeout=60,
        )

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        refused = check(busy.getsockname()[1], tmp_path / "var-a")
    assert refused.returncode == 1, refused
    assert "is already in use" in refused.stderr

    port = free_port()
    passed = check(port, tmp_path / "var-b")
    assert passed.returncode == 0, passed
    with socket.socket() as again:  # nothing kept: the port is free after the check
        again.bind(("127.0.0.1", port))

    process, running_port = embedded_paw(tmp_path, migrated_sqlite)
    with process as first:
        wait_http(f"http://127.0.0.1:{running_port}/healthz", process=first)
        other = check(free_port(), tmp_path / "var")
        assert other.returncode == 1, other
        assert f"Another PAW (pid {first.pid}) is already running" in other.stderr


def test_the_check_refuses_python_agent_harness_unless_the_operator_accepts_it(tmp_path):
    """python-agent-harness runs its tools without asking (docs/runtime.md, *Ungated
    runtimes*): `runpaw --check` (so `make run`, before anything) refuses a PAW_HARNESS_CMD
    naming it unless PAW_ALLOW_UNGATED_RUNTIME says the operator knows; another program
    than paw-agent passes with a warning (its ready decides, at each sandbox's start)."""

    def check(**env: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [PYTHON, "manage.py", "runpaw", "--check"],
            cwd=ROOT,
            env={
                **os.environ,
                **embedded_env(tmp_path / "var", tmp_path / "check.sqlite3", free_port()),
                **env,
            },
            capture_output=True,
            text=True,
            timeout=60,
        )

    refused = check(PAW_HARNESS_CMD="python-agent-harness serve")
    assert refused.returncode == 1, refused
    assert "PAW_HARNESS_CMD runs python-agent-harness" in refused.stderr
    assert "PAW_ALLOW_UNGATED_RUNTIME=1" in refused.stderr
    accepted = check(PAW_HARNESS_CMD="python-agent-harness serve", PAW_ALLOW_UNGATED_RUNTIME="1")
    assert accepted.returncode == 0, accepted
    assert "python-agent-harness" not in accepted.stderr
    other = check(PAW_HARNESS_CMD=f"{PYTHON} -m my_runtime serve")
    assert other.returncode == 0, other
    assert "not paw-agent" in other.stderr and "approval_gate" in other.stderr
    default = check()  # paw-agent: nothing to say
    assert default.returncode == 0 and "approval_gate" not in default.stderr, default


@pytest.mark.parametrize("value", ["0", "70000", "eighty"])
def test_an_invalid_paw_port_is_refused_clearly(tmp_path, value):
    env = {**embedded_env(tmp_path, tmp_path / "paw.sqlite3"), "PAW_PORT": value}
    result = subprocess.run(
        [PYTHON, "manage.py", "runpaw"],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0
    assert f"PAW_PORT='{value}' is not a TCP port: use a number from 1 to 65535" in result.stderr


def redis_paw(port: int, node: str, **env: str):
    env = {
        "PAW_PORT": str(port),
        "PAW_NODE_NAME": node,
        "PAW_DATABASE_URL": worker_database_url(),
        **env,
    }
    command = [PYTHON, "manage.py", "runpaw", "--grace", "20"]
    return child_process(command, env=env, stop_signal=signal.SIGINT)


def test_redis_mode_runs_web_worker_and_beat_as_children_and_stops_them(db):
    """Two web processes (PAW_WEB_PROCESSES) share the port. With PAW_LOG_JSON=1 every line
    any of the processes writes is JSON."""
    from paw_project.celery import app

    port = free_port()
    node = f"runpaw-{os.getpid()}-{port}"
    base = f"http://127.0.0.1:{port}"
    with redis_paw(port, node, PAW_LOG_JSON="1", PAW_WEB_PROCESSES="2") as paw:
        wait_http(f"{base}/healthz", process=paw)
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=[f"paw@{node}"], timeout=0.5):
            assert time.monotonic() < deadline, output_of(paw)
        children = _children_of(paw.pid)
        assert len(children) == 4, output_of(paw)
        web = [
            pid
            for pid in children
            if b"paw_project.web" in Path(f"/proc/{pid}/cmdline").read_bytes()
        ]
        assert len(web) == 2, output_of(paw)
        assert http_get(f"{base}/healthz", headers={"X-Request-ID": "json-1"})[0] == 200
        status, body, _ = http_get(f"{base}/api/x", headers={"Host": "evil.example"})
        assert (status, json.loads(body)["code"]) == (400, "bad_request")
        paw.send_signal(signal.SIGINT)
        assert paw.wait(timeout=40) == 0, output_of(paw)
    assert [pid for pid in children if process_alive(pid)] == []
    assert node != settings.PAW_NODE_NAME

    lines = [json.loads(line) for line in output_of(paw).splitlines() if line.strip()]
    for line in lines:
        assert datetime.fromisoformat(line["time"]).utcoffset() is not None, line
    access = [line for line in lines if line["logger"] == "paw.access"]
    assert any(a["path"] == "/healthz" and a["request_id"] == "json-1" for a in access), access
    disallowed = [line for line in lines if line["logger"] == "django.security.DisallowedHost"]
    assert len(disallowed) == 1 and disallowed[0]["level"] == "WARNING", disallowed
    assert "exc_info" not in disallowed[0]
    assert lines[-1]["message"] == "PAW stopped."


def test_redis_mode_exits_1_naming_a_child_that_exits_on_its_own(db):
    port = free_port()
    with redis_paw(port, f"runpaw-{os.getpid()}-{port}") as paw:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=paw)
        [beat] = [
            pid
            for pid in _children_of(paw.pid)
            if b"beat" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        ]
        os.kill(beat, signal.SIGKILL)
        assert paw.wait(timeout=40) == 1, output_of(paw)
    assert "beat exited (code -9); stopping the rest." in output_of(paw)
    assert "PAW stopped because beat exited unexpectedly." in output_of(paw)
