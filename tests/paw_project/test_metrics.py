"""Metrics, scraped from a live stack: a real web process (``python -m paw_project.web``)
and a real worker node (its own endpoint, ``PAW_WORKER_METRICS_PORT``), parsed with
prometheus_client's own parser. After real runs of the real runtime against the scripted
model, each counter moved by exactly what happened; without the token, 401."""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.sync.client import connect

from accounts.models import User
from accounts.services import auth_token_pair_for
from billing.models import Budget, UsageEvent
from conversations.models import Approval, Run, RunEvent
from conversations.services.workspaces import workspace_ensure
from paw_project.metrics import BoundedLabel
from sandboxes.models import Sandbox
from tests.conftest import PAW_AGENT, SCRIPTED_API_KEY
from tests.live import wait_for
from tests.processes import (
    PYTHON,
    child_process,
    free_port,
    http_get,
    wait_http,
    worker_database_url,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TOKEN = "metrics-token-for-the-tests-0123456789"
BEARER = {"Authorization": f"Bearer {TOKEN}"}
WAIT = 60
TITLE = {"text": "Title", "usage": {"prompt_tokens": 1, "completion_tokens": 1}}
#: Streamed text without an "s": nothing a secret ("sk-…") could start with is held back,
#: so every stored event is one line the runtime wrote.
DIGITS = "0123456789 " * 20

Samples = dict[tuple[str, frozenset], float]


def parse(text: str) -> Samples:
    """``{(sample name, labels): value}`` of an exposition, by prometheus_client's parser."""
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    """One sample's value (0 when absent: a labelled counter appears at its first use)."""
    return samples.get((name, frozenset(labels.items())), 0.0)


class Stack:
    """A web process and the worker node, each scraped on its own endpoint."""

    def __init__(self, web: str, worker: str, node: str) -> None:
        self.web, self.worker, self.node = web, worker, node

    def scrape(self, url: str, headers: dict[str, str] | None = None) -> Samples:
        status, body, response_headers = http_get(
            url, headers=BEARER if headers is None else headers
        )
        assert status == 200, body
        assert response_headers["Content-Type"].startswith("text/plain; version=0.0.4")
        return parse(body.decode())

    def both(self) -> tuple[Samples, Samples]:
        return self.scrape(f"{self.web}/metrics"), self.scrape(f"{self.worker}/metrics")

    def api(self, method: str, path: str, token: str, body: Any = None) -> tuple[int, Any]:
        request = urllib.request.Request(  # noqa: S310 - loopback
            f"{self.web}{path}",
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")


@contextmanager
def live_stack(worker_node, scripted_model, **worker_env: str) -> Iterator[Stack]:
    worker_port, web_port = free_port(), free_port()
    worker_node.use(
        PAW_AGENT,
        PAW_METRICS_TOKEN=TOKEN,
        PAW_WORKER_METRICS_PORT=str(worker_port),
        **worker_env,
    )
    env = {
        "PAW_DATABASE_URL": worker_database_url(),
        "PAW_METRICS_TOKEN": TOKEN,
        "PAW_LLM_BASE_URL": scripted_model.base_url,
        "PAW_LLM_API_KEY": SCRIPTED_API_KEY,
        "PAW_LLM_MODEL": "scripted-model",
        "PAW_THROTTLE_AUTH": "2/min",
    }
    command = [PYTHON, "-m", "paw_project.web", "--host", "127.0.0.1", "--port", str(web_port)]
    with child_process(command, env=env) as web:
        wait_http(f"http://127.0.0.1:{web_port}/healthz", process=web)
        yield Stack(
            f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{worker_port}", worker_node.name
        )


@pytest.fixture
def stack(worker_node, scripted_model, reset_throttles) -> Iterator[Stack]:
    with live_stack(worker_node, scripted_model) as running:
        yield running


class Tab:
    """A websocket on a conversation, through the web process, collecting ``run.event``s."""

    def __init__(self, stack: Stack, conversation_id: str, token: str) -> None:
        url = (
            stack.web.replace("http", "ws", 1)
            + f"/ws/conversations/{conversation_id}/?token={token}"
        )
        self.socket = connect(url, origin=stack.web)
        self.events: list[dict] = []
        self.socket.send(json.dumps({"type": "resume", "after": 0}))
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        for raw in self.socket:
            message = json.loads(raw)
            if message["type"] == "run.event":
                self.events.append(message)

    def close(self) -> None:
        self.socket.close()
        self._thread.join(10)


def start_run(stack: Stack, token: str, prompt: str, *, files: tuple[str, ...] = ()) -> Run:
    """A run of a new conversation (whose workspace holds ``files``), through the API."""
    status, conversation = stack.api("POST", "/api/conversations", token, {})
    assert status == 201, conversation
    for name in files:
        (workspace_ensure(conversation["id"]) / name).write_text("old\n")
    status, run = stack.api(
        "POST", f"/api/conversations/{conversation['id']}/runs", token, {"prompt": prompt}
    )
    assert status == 202, run
    return Run.objects.get(id=run["id"])


def token_of(username: str) -> str:
    """A JWT access token of a new user ``username``."""
    user = User.objects.create_user(username=username, password="x" * 20)
    return auth_token_pair_for(user=user)["access"]


DONE = {"api_key": SCRIPTED_API_KEY, "untooled": TITLE, "fallback": "Done."}


def finished(run_id) -> Run | None:
    return Run.objects.filter(id=run_id, status__in=Run.FINISHED_STATUSES).first()


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_counters_move_by_what_a_run_did_across_the_web_process_and_the_worker(
    stack, scripted_model
):
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": TITLE,
            "responses": [
                {
                    "text": DIGITS,
                    "chunk": 11,
                    # 10 ms apart: each piece a line of its own (paw-agent joins pieces
                    # closer than 3 ms), so the run has many lines to count.
                    "chunk_delay": 0.01,
                    "usage": {"prompt_tokens": 120, "completion_tokens": 30},
                }
            ],
        }
    )
    token = token_of("metrics-ada")
    status, conversation = stack.api("POST", "/api/conversations", token, {})
    assert status == 201
    web0, worker0 = stack.both()

    tab = Tab(stack, conversation["id"], token)
    try:
        status, body = stack.api(
            "POST", f"/api/conversations/{conversation['id']}/runs", token, {"prompt": "Count."}
        )
        assert status == 202, body
        run = wait_for(lambda: finished(body["id"]), timeout=WAIT, what="the run to end")
        assert run.status == Run.Status.DONE, run.errors
        stored = RunEvent.objects.filter(run=run).count()
        wait_for(lambda: len(tab.events) == stored, timeout=WAIT, what="every event on the socket")
    finally:
        tab.close()
    web1, worker1 = stack.both()
    node = stack.node

    # Runs: accepted by the web process, finished (with its duration and first token) on the node.
    assert moved(web0, web1, "paw_runs_started_total") == 1
    assert moved(worker0, worker1, "paw_runs_finished_total", status="done", code="") == 1
    assert moved(worker0, worker1, "paw_run_duration_seconds_count", status="done") == 1
    duration = moved(worker0, worker1, "paw_run_duration_seconds_sum", status="done")
    assert 0 < duration <= (run.finished_at - run.created_at).total_seconds() + 0.001
    assert moved(worker0, worker1, "paw_run_first_token_seconds_count") == 1
    assert 0 < moved(worker0, worker1, "paw_run_first_token_seconds_sum") <= duration

    # The relay: every line stored once, each one's read→send lag observed; the events
    # went live through the live log (Redis mode), the run's status changes through the
    # channel layer (queued from the web; starting, running, done from the node); every
    # event the socket got came live (send→client lag) or was read back.
    # The runtime's lines are numbered 1..N, the result last; deltas read together on the
    # node were joined into one event, so there may be fewer events than lines.
    lines = RunEvent.objects.get(run=run, type="result").payload["seq"]
    assert lines > 20 and stored <= lines
    assert moved(worker0, worker1, "paw_relay_lines_stored_total", node=node) == lines
    assert moved(worker0, worker1, "paw_relay_read_to_send_seconds_count") == lines
    assert moved(worker0, worker1, "paw_relay_live_appends_total") == stored
    assert moved(worker0, worker1, "paw_relay_channel_sends_total", type="conversation.events") == 0
    assert moved(web0, web1, "paw_relay_channel_sends_total", type="conversation.message") == 1
    assert (
        moved(worker0, worker1, "paw_relay_channel_sends_total", type="conversation.message") == 3
    )
    live = moved(web0, web1, "paw_relay_send_to_client_seconds_count")
    replayed = sum(
        moved(web0, web1, "paw_relay_events_replayed_total", reason=reason)
        for reason in ("resume", "connect", "gap", "quiet_check", "resync")
    )
    assert live + replayed == stored and live >= 1

    # Sandboxes: one spawned for the new conversation, idle now (as many as the node's rows say).
    assert moved(worker0, worker1, "paw_sandbox_spawns_total", node=node, result="ok") == 1
    live_rows = Sandbox.objects.filter(node=node, state__in=Sandbox.LIVE_STATES).count()
    assert value(worker1, "paw_sandboxes", node=node, state="idle") == live_rows >= 1
    assert value(worker1, "paw_sandboxes", node=node, state="busy") == 0

    # Tokens as billed, by provider and model.
    (usage,) = UsageEvent.objects.filter(run=run)
    labels = {"provider": "default", "model": "scripted-model", "source": "reported"}
    assert usage.input_tokens >= 120 and not usage.estimated
    assert (
        moved(worker0, worker1, "paw_tokens_total", direction="input", **labels)
        == usage.input_tokens
    )
    assert (
        moved(worker0, worker1, "paw_tokens_total", direction="output", **labels)
        == usage.output_tokens
    )

    # HTTP requests by view (django-prometheus), on the web process.
    by_view = "django_http_requests_total_by_view_transport_method_total"
    assert moved(web0, web1, by_view, view="api-runs", transport="http", method="POST") == 1

    # What waits, counted in the database by the web process only.
    assert value(web1, "paw_runs_queued") == Run.objects.filter(status="queued").count()
    assert ("paw_runs_queued", frozenset()) not in worker1


def test_approvals_raised_decided_and_pending_now(stack, scripted_model):
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": TITLE,
            "responses": [
                {"tool_calls": [{"name": "delete_file", "arguments": {"path": "old.txt"}}]},
                "Finished: {{tool_result}}",
            ],
        }
    )
    token = token_of("metrics-bea")
    web0, worker0 = stack.both()
    run = start_run(stack, token, "Delete old.txt", files=("old.txt",))
    approval = wait_for(
        lambda: Approval.objects.filter(run=run, status="pending").first(),
        timeout=WAIT,
        what="the confirm",
    )
    pending = stack.scrape(f"{stack.web}/metrics")
    assert (
        value(pending, "paw_approvals_pending")
        == Approval.objects.filter(status="pending").count()
        >= 1
    )
    status, body = stack.api(
        "POST", f"/api/approvals/{approval.id}/decision", token, {"approved": False}
    )
    assert status == 200, body
    wait_for(lambda: finished(run.id), timeout=WAIT, what="the run to end")
    web1, worker1 = stack.both()

    assert moved(worker0, worker1, "paw_approvals_raised_total", kind="confirm") == 1
    assert (
        moved(web0, web1, "paw_approvals_decided_total", decided_by="user", status="declined") == 1
    )
    assert value(web1, "paw_approvals_pending") == Approval.objects.filter(status="pending").count()


def test_budget_refusals_and_throttled_requests_by_scope(stack, scripted_model):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": TITLE, "responses": ["Done."]})
    token = token_of("metrics-cy")
    run = start_run(stack, token, "Anything")
    wait_for(lambda: finished(run.id), timeout=WAIT, what="the run to end")
    Budget.objects.create(user=run.user, monthly_tokens=1)  # used up by that run
    web0 = stack.scrape(f"{stack.web}/metrics")

    status, conversation = stack.api("POST", "/api/conversations", token, {})
    status, body = stack.api(
        "POST", f"/api/conversations/{conversation['id']}/runs", token, {"prompt": "More"}
    )
    assert status == 402 and body["code"] == "budget_exhausted"
    # PAW_THROTTLE_AUTH=2/min for this web process: the third token call from here is refused.
    codes = [
        stack.api("POST", "/api/auth/token", "", {"username": "nobody", "password": "wrong"})[0]
        for _ in range(3)
    ]
    assert codes == [401, 401, 429]
    web1 = stack.scrape(f"{stack.web}/metrics")

    assert moved(web0, web1, "paw_budget_refusals_total", stage="start") == 1
    assert moved(web0, web1, "paw_throttled_requests_total", scope="auth") == 1
    assert moved(web0, web1, "paw_runs_started_total") == 0


def test_evictions_and_crashes_are_counted_on_the_node(
    worker_node, scripted_model, reset_throttles
):
    scripted_model.load(DONE)
    token = token_of("metrics-dee")
    with live_stack(worker_node, scripted_model, PAW_MAX_SANDBOXES_PER_NODE="1") as stack:
        node = stack.node
        worker0 = stack.scrape(f"{stack.worker}/metrics")
        runs = []
        for prompt in ("First", "Second"):  # the second conversation's sandbox evicts the first's
            run = start_run(stack, token, prompt)
            runs.append(wait_for(lambda run=run: finished(run.id), timeout=WAIT, what="a run"))
        assert [run.status for run in runs] == ["done", "done"]
        (sandbox,) = Sandbox.objects.filter(node=node, state__in=Sandbox.LIVE_STATES)
        os.kill(sandbox.pid, signal.SIGKILL)
        wait_for(
            lambda: Sandbox.objects.filter(id=sandbox.id, state="dead").exists(),
            timeout=WAIT,
            what="the crash to be recorded",
        )
        worker1 = stack.scrape(f"{stack.worker}/metrics")
    assert moved(worker0, worker1, "paw_sandbox_spawns_total", node=node, result="ok") == 2
    assert moved(worker0, worker1, "paw_sandbox_evictions_total", node=node) == 1
    assert moved(worker0, worker1, "paw_sandbox_crashes_total", node=node) == 1
    assert value(worker1, "paw_sandboxes", node=node, state="idle") == 0


def test_an_idle_sandbox_shut_down_after_its_ttl_is_counted(
    worker_node, scripted_model, reset_throttles
):
    scripted_model.load(DONE)
    token = token_of("metrics-eve")
    with live_stack(worker_node, scripted_model, PAW_SANDBOX_TTL_SECONDS="1") as stack:
        worker0 = stack.scrape(f"{stack.worker}/metrics")
        run = start_run(stack, token, "Once")
        wait_for(lambda: finished(run.id), timeout=WAIT, what="the run to end")
        wait_for(
            lambda: Sandbox.objects.filter(
                conversation_id=run.conversation_id, state="stopped"
            ).exists(),
            timeout=WAIT,
            what="the idle shutdown",
        )
        worker1 = stack.scrape(f"{stack.worker}/metrics")
    assert moved(worker0, worker1, "paw_sandbox_idle_shutdowns_total", node=stack.node) == 1
    assert moved(worker0, worker1, "paw_sandbox_crashes_total", node=stack.node) == 0


def test_metrics_answer_401_without_the_token_and_staff_sessions_only(stack, client):
    for url in (f"{stack.web}/metrics", f"{stack.worker}/metrics"):
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token"},
            {"Authorization": f"Basic {TOKEN}"},
        ):
            status, body, response_headers = http_get(url, headers=headers)
            assert status == 401, (url, headers)
            assert json.loads(body)["code"] == "not_authenticated"
            assert response_headers["WWW-Authenticate"].startswith("Bearer")
    status, _, _ = http_get(f"{stack.worker}/other", headers=BEARER)
    assert status == 404

    # A signed-in staff member may look from the browser; anyone else may not.
    staff = User.objects.create_user(username="metrics-staff", password="x" * 20, is_staff=True)
    member = User.objects.create_user(username="metrics-member", password="x" * 20)
    for user, expected in ((member, 401), (staff, 200)):
        client.force_login(user)
        cookie = f"sessionid={client.cookies['sessionid'].value}"
        status, body, _ = http_get(f"{stack.web}/metrics", headers={"Cookie": cookie})
        assert status == expected, body
    assert b"paw_runs_started_total" in body


def test_bounded_label_keeps_the_first_values_and_folds_the_rest_into_other():
    label = BoundedLabel(limit=2, max_chars=5)
    assert [label(v) for v in ("a", "b", "c", "a", "abcdefgh", None)] == [
        "a",
        "b",
        "other",
        "a",
        "other",
        "other",
    ]
