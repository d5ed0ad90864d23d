"""/healthz answers while the process serves; /readyz only when every dependency answers,
always within a bounded time, and without telling anonymous callers more than what
failed."""

from __future__ import annotations

import json
import re
import shutil
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.processes import (
    free_port,
    http_get,
    output_of,
    wait_http,
    web_process,
    worker_database_url,
)

#: Seconds a probe may take before the test calls it hung (the checks stop at ~2 s).
PROBE_LIMIT = 15.0


def probe_concurrently(url: str, count: int) -> list[tuple[int, dict]]:
    """``count`` simultaneous GETs of ``url``; each must answer within ``PROBE_LIMIT`` s."""

    def probe(_: int) -> tuple[int, dict]:
        status, body, _headers = http_get(url, timeout=PROBE_LIMIT)
        return status, json.loads(body)

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(probe, range(count)))


def test_healthz_is_200_while_serving(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_probes_answer_405_to_a_post_not_a_csrf_403(client):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    assert strict.post("/healthz").status_code == 405
    assert strict.post("/readyz").status_code == 405


def test_readyz_is_200_when_database_broker_layer_and_a_worker_answer(client, db, celery_worker):
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json() == {
        "status": "ok",
        "checks": {"database": "ok", "broker": "ok", "channel_layer": "ok", "worker": "ok"},
        "sandbox_network": "isolated" if shutil.which("bwrap") else "host",
    }


@pytest.mark.slow
def test_thirty_concurrent_probes_all_answer_and_a_later_probe_still_works(db, celery_worker):
    """Each probe used to hold a broker pool connection while waiting for a second one:
    ten at once exhausted the pool and every probe after hung for good."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with web_process(port, PAW_DATABASE_URL=worker_database_url()) as web:
        wait_http(f"{base}/healthz", process=web)
        results = probe_concurrently(f"{base}/readyz", 30)
        assert [status for status, _ in results] == [200] * 30, results
        time.sleep(2)  # past the shared result: this probe runs the checks again
        status, body, _ = http_get(f"{base}/readyz", timeout=PROBE_LIMIT)
        assert status == 200, body


def test_readyz_is_503_naming_each_failed_dependency_quickly_and_without_internals(tmp_path):
    """A web process whose database and Redis are unreachable reports each failure by name
    within a few seconds; why goes to its log, once per check, at WARNING."""
    dead = free_port()  # nothing listens here
    port = free_port()
    env = {
        "PAW_DATABASE_URL": f"postgres://postgres@127.0.0.1:{dead}/paw",
        "PAW_REDIS_URL": f"redis://127.0.0.1:{dead}/0",
        "PAW_VAR_DIR": str(tmp_path),
    }
    with web_process(port, **env) as web:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=web)
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        started = time.monotonic()
        status, body, _ = http_get(f"http://127.0.0.1:{port}/readyz", timeout=PROBE_LIMIT)
        elapsed = time.monotonic() - started
        time.sleep(0.5)  # let the log lines reach the file
        log = output_of(web)
    assert status == 503
    assert json.loads(body) == {
        "status": "unavailable",
        "checks": {
            "database": "unavailable",
            "broker": "unavailable",
            "channel_layer": "unavailable",
            "worker": "unavailable",
        },
        "sandbox_network": "isolated" if shutil.which("bwrap") else "host",
    }
    assert elapsed < 5, f"/readyz took {elapsed:.1f} s during the outage"
    for name in ("database", "broker", "channel_layer", "worker"):
        failures = re.findall(rf"WARNING paw_project.health \[\w+\] readiness check {name}\b", log)
        assert len(failures) == 1, log
    assert "ERROR django.request" not in log, log
