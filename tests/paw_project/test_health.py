"""/healthz answers while the process serves; /readyz only when every dependency answers."""

from __future__ import annotations

import json

from tests.support import PYTHON, child_process, free_port, http_get, wait_http


def test_healthz_is_200_while_serving(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


def test_readyz_is_200_when_database_broker_layer_and_a_worker_answer(client, db, celery_worker):
    response = client.get("/readyz")
    assert response.status_code == 200, response.json()
    assert response.json() == {
        "status": "ok",
        "checks": {"database": "ok", "broker": "ok", "channel_layer": "ok", "worker": "ok"},
    }


def test_readyz_is_503_naming_each_dependency_that_fails(tmp_path):
    """A web process whose database and Redis are unreachable reports each failure."""
    dead = free_port()  # nothing listens here
    port = free_port()
    env = {
        "PAW_DATABASE_URL": f"postgres://postgres@127.0.0.1:{dead}/paw",
        "PAW_REDIS_URL": f"redis://127.0.0.1:{dead}/0",
        "PAW_VAR_DIR": str(tmp_path),
    }
    command = [
        PYTHON,
        "-m",
        "daphne",
        "-b",
        "127.0.0.1",
        "-p",
        str(port),
        "paw_project.asgi:application",
    ]
    with child_process(command, env=env) as web:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=web)
        assert http_get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        status, body, _ = http_get(f"http://127.0.0.1:{port}/readyz", timeout=30)
    assert status == 503
    result = json.loads(body)
    assert result["status"] == "unavailable"
    assert set(result["checks"]) == {"database", "broker", "channel_layer", "worker"}
    assert all(value != "ok" for value in result["checks"].values()), result
