"""PostgreSQL connections stay bounded: each process borrows from a pool of at most
``PAW_DB_POOL_MAX_SIZE`` connections, however many requests (threads, under ASGI) run."""

from __future__ import annotations

import os
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.processes import free_port, http_get, wait_http, web_process, worker_database_url

pytestmark = pytest.mark.slow


def server_connections(application_name: str) -> int:
    """Connections the PostgreSQL server has open for ``application_name`` right now."""
    with psycopg.connect(worker_database_url(), autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            [application_name],
        ).fetchone()
    return row[0]


def test_a_burst_of_requests_opens_no_more_connections_than_the_pool_allows(db):
    port = free_port()
    name = f"paw-pool-test-{os.getpid()}-{port}"
    env = {
        "PAW_DATABASE_URL": f"{worker_database_url()}?application_name={name}",
        "PAW_DB_POOL_MAX_SIZE": "3",
    }
    peak = 0
    watching = threading.Event()

    def watch() -> None:
        nonlocal peak
        while watching.is_set():
            peak = max(peak, server_connections(name))
            time.sleep(0.01)

    def request(_: int) -> int:
        # An unknown session key: the session middleware looks it up in the database.
        cookie = {"Cookie": f"sessionid={secrets.token_hex(16)}"}
        return http_get(f"http://127.0.0.1:{port}/admin/login/", timeout=30, headers=cookie)[0]

    with web_process(port, **env) as web:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=web)
        watching.set()
        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        with ThreadPoolExecutor(max_workers=60) as pool:
            statuses = list(pool.map(request, range(120)))
        watching.clear()
        watcher.join(5)
        after = server_connections(name)
    assert statuses == [200] * 120
    assert 1 <= peak <= 3, f"{peak} connections at the peak of the burst"
    assert after <= 3
