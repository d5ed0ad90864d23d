"""`make run` keeps local state private; `make test` says how to start missing services."""

from __future__ import annotations

import os
import signal
import stat
import sys
from pathlib import Path

import pytest

from tests.pawenv import _start_postgres_hint, _start_redis_hint
from tests.processes import child_process, free_port, output_of, wait_http


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.slow
def test_make_run_recreates_an_empty_key_and_keeps_var_private(tmp_path):
    venv = Path(sys.prefix)  # the virtualenv running the tests: nothing to install
    var = tmp_path / "var"
    var.mkdir(mode=0o700)
    key = var / "secret_key"
    key.write_text("")
    key.chmod(0o644)
    port = free_port()
    env = {
        "PAW_VAR_DIR": str(var),
        "PAW_PORT": str(port),
        "PAW_SECRET_KEY": "",  # use the key file
        "PAW_REDIS_URL": "",
        "PAW_DATABASE_URL": f"sqlite:///{var / 'paw.sqlite3'}",
        "PAW_ADMIN_PASSWORD": "a-long-operator-password",
    }
    command = ["make", "-s", "-o", f"{venv}/.installed", f"VENV={venv}", "run"]
    with child_process(command, env=env, stop_signal=signal.SIGINT) as make:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=make, timeout=120)
        os.killpg(make.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        make.wait(timeout=30)
    assert f"Created a local secret key in {var}/secret_key" in output_of(make)
    assert len(key.read_text().strip()) >= 50
    assert _mode(key) == 0o600
    assert _mode(var / "paw.sqlite3") == 0o600


def test_the_hints_for_missing_services_use_the_host_and_port_of_their_urls():
    assert "--bind 127.0.0.1 --port 6390 " in _start_redis_hint("127.0.0.1", 6390)
    assert (
        _start_redis_hint("cache.internal", 6379) == "Start the Redis server on cache.internal:6379"
    )
    assert "pg_ctlcluster" in _start_postgres_hint("127.0.0.1", 5432)
    assert "port 5433" in _start_postgres_hint("localhost", 5433)
    assert (
        _start_postgres_hint("db.internal", 5432)
        == "Start the PostgreSQL server on db.internal:5432"
    )
