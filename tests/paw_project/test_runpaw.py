"""`manage.py runpaw` (what `make run` starts): embedded mode and Redis mode."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from django.conf import settings

from tests.support import (
    PYTHON,
    ROOT,
    child_process,
    free_port,
    http_get,
    output_of,
    wait_http,
    worker_database_url,
)

pytestmark = pytest.mark.slow


def _children_of(pid: int) -> list[int]:
    result = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True, check=False
    )
    return [int(p) for p in result.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_embedded_mode_serves_health_readiness_and_admin_in_one_process(tmp_path):
    port = free_port()
    env = {
        "PAW_REDIS_URL": "",
        "PAW_DATABASE_URL": f"sqlite:///{tmp_path / 'paw.sqlite3'}",
        "PAW_VAR_DIR": str(tmp_path),
        "PAW_PORT": str(port),
    }
    subprocess.run(
        [PYTHON, "manage.py", "migrate", "--noinput", "-v0"],
        cwd=ROOT,
        env={**os.environ, **env},
        check=True,
        timeout=120,
    )
    with child_process([PYTHON, "manage.py", "runpaw"], env=env, stop_signal=signal.SIGINT) as paw:
        base = f"http://127.0.0.1:{port}"
        wait_http(f"{base}/healthz", process=paw)
        status, body, _ = http_get(f"{base}/readyz", timeout=15)
        assert status == 200, body
        assert json.loads(body)["checks"]["worker"] == "ok"
        status, body, _ = http_get(f"{base}/admin/login/")
        assert status == 200 and b"Django administration" in body
        assert http_get(f"{base}/static/admin/css/base.css")[0] == 200
        assert _children_of(paw.pid) == []  # everything runs in one process
        paw.send_signal(signal.SIGINT)
        assert paw.wait(timeout=30) == 0, output_of(paw)
    assert "embedded" in output_of(paw)
    assert f"http://localhost:{port}/" in output_of(paw)


def test_redis_mode_runs_web_worker_and_beat_as_children_and_stops_them(db):
    from paw_project.celery import app

    port = free_port()
    node = f"runpaw-{os.getpid()}-{port}"
    env = {"PAW_PORT": str(port), "PAW_NODE_NAME": node, "PAW_DATABASE_URL": worker_database_url()}
    with child_process(
        [PYTHON, "manage.py", "runpaw", "--grace", "20"], env=env, stop_signal=signal.SIGINT
    ) as paw:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=paw)
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=[f"paw@{node}"], timeout=0.5):
            assert time.monotonic() < deadline, output_of(paw)
        children = _children_of(paw.pid)
        assert len(children) == 3, output_of(paw)
        paw.send_signal(signal.SIGINT)
        assert paw.wait(timeout=40) == 0, output_of(paw)
    assert [pid for pid in children if _alive(pid)] == []
    assert node != settings.PAW_NODE_NAME
