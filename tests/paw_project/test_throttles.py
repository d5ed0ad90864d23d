"""Throttles are exact under concurrency: every decision is one atomic step of the store."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import pytest

from accounts.models import User
from accounts.services import auth_token_pair_for
from conversations.models import Run
from paw_project import throttles
from tests.conftest import SCRIPTED_API_KEY
from tests.factories import conversation_of
from tests.live import wait_for
from tests.processes import free_port, wait_http, web_process, worker_database_url


@pytest.fixture(params=["redis", "memory"])
def store(request, settings):
    """The Redis store (production) or the embedded mode's memory store (the throttles
    take the store of the current ``REDIS_URL``)."""
    if request.param == "memory":
        settings.REDIS_URL = ""
    return request.param


def hit_concurrently(rate: str, scope: str, ident: str, count: int) -> list[int | None]:
    """``count`` threads released at once, each counting one request."""
    start = threading.Barrier(count)

    def hit(_: int) -> int | None:
        start.wait()
        return throttles.rate_hit(rate, scope, ident)

    with ThreadPoolExecutor(max_workers=count) as pool:
        return list(pool.map(hit, range(count)))


def test_concurrent_requests_get_exactly_the_limit_with_retry_after(store):
    ident = uuid.uuid4().hex
    waits = hit_concurrently("5/min", "test", ident, 40)
    assert waits.count(None) == 5
    assert all(isinstance(w, int) and 1 <= w <= 60 for w in waits if w is not None), waits
    # Refused requests were not counted, and the count is per identity.
    assert throttles.rate_hit("5/min", "test", ident) is not None
    assert throttles.rate_hit("5/min", "test", f"{ident}-other") is None
    throttles.rate_reset("test", ident)
    assert throttles.rate_hit("5/min", "test", ident) is None


def test_retry_after_is_when_the_oldest_counted_request_leaves_the_window(store):
    ident = uuid.uuid4().hex
    assert throttles.rate_hit("1/hour", "test", ident) is None
    assert 3590 <= throttles.rate_hit("1/hour", "test", ident) <= 3600


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_30_concurrent_run_starts_over_two_web_processes_accept_exactly_the_limit(
    scripted_model, celery_worker
):
    """The accepted runs really run (on the suite's worker) and are waited for, so that
    nothing of theirs is still writing when the test's data is removed."""
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "fallback": "Done."})
    user = User.objects.create_user(username="alice", password="x" * 20)
    token = auth_token_pair_for(user=user)["access"]
    conversations = [conversation_of(user, title=f"c{n}") for n in range(30)]
    env = {
        "PAW_DATABASE_URL": worker_database_url(),
        "PAW_THROTTLE_RUNS": "5/min",
        "PAW_WEB_THREADS": "15",  # every request of the burst in flight at once
        "PAW_LLM_BASE_URL": scripted_model.base_url,
        "PAW_LLM_API_KEY": SCRIPTED_API_KEY,
        "PAW_LLM_MODEL": "scripted-model",
    }
    ports = [free_port(), free_port()]
    with ExitStack() as stack:
        processes = [stack.enter_context(web_process(port, **env)) for port in ports]
        for port, process in zip(ports, processes, strict=True):
            wait_http(f"http://127.0.0.1:{port}/healthz", process=process)
        clients = [
            stack.enter_context(
                httpx.Client(
                    base_url=f"http://127.0.0.1:{port}",
                    headers={"Authorization": f"Bearer {token}"},
                    timeout=60,
                )
            )
            for port in ports
        ]
        for client in clients:  # one connection open to each process before the burst
            assert client.get("/api/auth/me").status_code == 200
        start = threading.Barrier(len(conversations))

        def start_run(n: int) -> httpx.Response:
            client = clients[n % 2]  # half to each web process
            start.wait()
            return client.post(
                f"/api/conversations/{conversations[n].id}/runs", json={"prompt": "hi"}
            )

        with ThreadPoolExecutor(max_workers=len(conversations)) as pool:
            responses = list(pool.map(start_run, range(len(conversations))))

    codes = [r.status_code for r in responses]
    assert sorted(codes) == [202] * 5 + [429] * 25, codes
    for response in responses:
        if response.status_code == 429:
            assert response.json()["code"] == "throttled"
            assert 1 <= int(response.headers["Retry-After"]) <= 60
    runs = Run.objects.filter(conversation__user=user)
    assert runs.count() == 5
    wait_for(
        lambda: not runs.filter(status__in=Run.ACTIVE_STATUSES).exists(),
        timeout=120,
        what="the accepted runs to finish",
    )
    assert set(runs.values_list("status", flat=True)) == {Run.Status.DONE}
