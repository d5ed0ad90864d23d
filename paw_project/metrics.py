"""PAW's own Prometheus metrics: the one module that owns the metric objects.

Code where a thing happens calls one function of this module (``run_finished``,
``sandbox_spawned``, ...); what is counted, under which name and labels, is decided here.
The names are the public interface (the Grafana dashboard in ``deploy/`` and operators'
alerts use them), listed in docs/operations.md, *Metrics (Prometheus)*.

One registry per process (prometheus_client's default ``REGISTRY``, which django-prometheus
uses for the HTTP metrics too): every process is scraped on its own endpoint (a web
process at ``/metrics``, a worker node on ``PAW_WORKER_METRICS_PORT``), and Prometheus
adds the series of all processes up (``sum(rate(...))``). Counters therefore count what
happened *in this process*: a run is counted as started by the web process that accepted
it and as finished by the process that ended it (the worker node, mostly). See
:mod:`paw_project.metrics_http` for the endpoints and docs/operations.md for why it is not
prometheus_client's multiprocess mode.

Label values that come from outside PAW's code (a runtime's error codes, the model a
provider reports) go through :class:`BoundedLabel`, so a hostile or chatty runtime cannot
grow a process's memory or the time series without bound.

Everything here is thread-safe (prometheus_client's values take a lock) and cheap (about a
microsecond an update): it may be called on hot paths, e.g. once per relayed line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime

from prometheus_client import REGISTRY, Counter, Histogram, disable_created_metrics
from prometheus_client.core import GaugeMetricFamily, Metric

# No `<name>_created` series beside every counter and histogram: Prometheus's rate()
# handles restarts without them, and they double the series a scrape carries.
disable_created_metrics()

#: Label value standing for every value past a :class:`BoundedLabel`'s limit.
OTHER = "other"


class BoundedLabel:
    """The values one label may take: the first ``limit`` distinct values seen (each cut to
    ``max_chars``) are kept, any later new one becomes ``"other"``."""

    def __init__(self, *, limit: int, max_chars: int = 64) -> None:
        self.limit = limit
        self.max_chars = max_chars
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def __call__(self, value: object) -> str:
        text = str(value or "")[: self.max_chars]
        if text in self._seen:
            return text
        with self._lock:
            if text in self._seen or len(self._seen) < self.limit:
                self._seen.add(text)
                return text
        return OTHER


_error_code = BoundedLabel(limit=100)
_model = BoundedLabel(limit=200, max_chars=100)
_provider = BoundedLabel(limit=100)

# Seconds; runs take from under a second (a cancelled queued run) to PAW_RUN_TIMEOUT_SECONDS.
_RUN_BUCKETS = (0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600)
_FIRST_TOKEN_BUCKETS = (0.1, 0.25, 0.5, 1, 1.5, 2, 3, 5, 10, 20, 30, 60)
# Seconds; the relay's two halves are milliseconds when healthy, seconds when far behind.
_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)

# --- runs ------------------------------------------------------------------------------------

RUNS_STARTED = Counter(
    "paw_runs_started", "Runs accepted (POST .../runs: created queued), in this process."
)
RUNS_FINISHED = Counter(
    "paw_runs_finished",
    "Runs finished, by final status and error code (empty unless status is error).",
    ["status", "code"],
)
RUN_DURATION = Histogram(
    "paw_run_duration_seconds",
    "Seconds from a run's creation (queued) to its end, by final status.",
    ["status"],
    buckets=_RUN_BUCKETS,
)
RUN_FIRST_TOKEN = Histogram(
    "paw_run_first_token_seconds",
    "Seconds from a run's creation (queued) to its first streamed text reaching the node.",
    buckets=_FIRST_TOKEN_BUCKETS,
)

# --- sandboxes (worker nodes) ----------------------------------------------------------------

SANDBOX_STATES = ("starting", "idle", "busy", "stopping", "spare")
SANDBOX_SPAWNS = Counter(
    "paw_sandbox_spawns",
    "Sandboxes started for conversations on this node, spawned or handed over from the "
    "spares, by result (ok: it said ready or took its hand-over; failed).",
    ["node", "result"],
)
SANDBOX_SPARES = Counter(
    "paw_sandbox_spares",
    "Spare runtimes of this node (PAW_SANDBOX_SPARES), by event: started (it said ready), "
    "failed (it did not), handed_over (to a new conversation), died (it exited while "
    "waiting).",
    ["node", "event"],
)
SANDBOX_CRASHES = Counter(
    "paw_sandbox_crashes", "Runtime processes that exited without PAW stopping them.", ["node"]
)
SANDBOX_EVICTIONS = Counter(
    "paw_sandbox_evictions",
    "Idle sandboxes stopped to make room (PAW_MAX_SANDBOXES_PER_NODE).",
    ["node"],
)
SANDBOX_IDLE_SHUTDOWNS = Counter(
    "paw_sandbox_idle_shutdowns",
    "Sandboxes shut down after PAW_SANDBOX_TTL_SECONDS without activity.",
    ["node"],
)

# --- the relay: runtime line -> live log (Redis mode) / database -> websocket ------------------

RELAY_LINES_STORED = Counter(
    "paw_relay_lines_stored", "Runtime lines stored as events by this node's pipeline.", ["node"]
)
RELAY_READ_TO_SEND = Histogram(
    "paw_relay_read_to_send_seconds",
    "Seconds from a runtime line reaching the node's pipeline to its event being sent: "
    "appended to the live log in Redis mode (then stored), sent after its storing "
    "transaction in the embedded mode.",
    buckets=_LAG_BUCKETS,
)
RELAY_SEND_TO_CLIENT = Histogram(
    "paw_relay_send_to_client_seconds",
    "Seconds from the send of a live event (its live-log append, or its channel-layer send "
    "in the embedded mode) to its websocket send (clocks of two hosts: keep them in sync).",
    buckets=_LAG_BUCKETS,
)
RELAY_LIVE_APPENDS = Counter(
    "paw_relay_live_appends",
    "Events appended to the conversations' live logs by this process (Redis mode).",
)
RELAY_CHANNEL_SENDS = Counter(
    "paw_relay_channel_sends",
    "Channel-layer group sends from this process, by message type.",
    ["type"],
)
RELAY_EVENTS_REPLAYED = Counter(
    "paw_relay_events_replayed",
    "Events a websocket read back (live log or database) instead of receiving them live, "
    "by why: resume (the client asked), connect (no resume came), gap (a live message "
    "skipped cursors), quiet_check (a quiet connection found it lacked events), resync "
    "(its subscription was lost, or it fell too far behind).",
    ["reason"],
)

# --- approvals, usage, limits -------------------------------------------------------------------

APPROVALS_RAISED = Counter(
    "paw_approvals_raised", "Approvals the runtime asked for, by kind (confirm, ask).", ["kind"]
)
APPROVALS_DECIDED = Counter(
    "paw_approvals_decided",
    "Approvals decided, by who (user, auto, timeout, system) and outcome.",
    ["decided_by", "status"],
)
TOKENS = Counter(
    "paw_tokens",
    "Tokens of finished runs, by provider, model, direction (input, output) and source "
    "(reported by the provider, or estimated).",
    ["provider", "model", "direction", "source"],
)
BUDGET_REFUSALS = Counter(
    "paw_budget_refusals",
    "Token budget refusals: start (a run refused, 402) or run (a run stopped past a budget).",
    ["stage"],
)
THROTTLED = Counter(
    "paw_throttled_requests",
    "Requests refused by a rate limit, by scope (runs, auth, uploads, secrets, password, "
    "websocket, bearer: a bearer token from an address past PAW_THROTTLE_BAD_TOKENS).",
    ["scope"],
)
BEARER_FAILURES = Counter(
    "paw_bearer_auth_failures",
    "Bearer tokens (Authorization: Bearer, or a websocket's token) that were checked and "
    "did not authenticate, by kind: personal (paw_…) or jwt.",
    ["kind"],
)


# --- what the code calls ------------------------------------------------------------------------


def run_started() -> None:
    """A run was created (call after commit)."""
    RUNS_STARTED.inc()


def run_finished(
    *, status: str, errors: list[dict[str, str]], created_at: datetime, finished_at: datetime
) -> None:
    """A run ended (call after commit): ``errors`` its ``[{"code", "message"}]``, the times
    its row carries."""
    code = _error_code(errors[0].get("code")) if status == "error" and errors else ""
    RUNS_FINISHED.labels(status=status, code=code).inc()
    RUN_DURATION.labels(status=status).observe(max(0.0, (finished_at - created_at).total_seconds()))


def run_first_token(*, queued_at: float, arrived: float) -> None:
    """A run's first streamed text was stored: ``queued_at`` is the run's creation (epoch
    seconds), ``arrived`` when that text reached the node's pipeline (``time.monotonic()``)."""
    arrived_at = time.time() - (time.monotonic() - arrived)
    RUN_FIRST_TOKEN.observe(max(0.0, arrived_at - queued_at))


def sandbox_spawned(*, node: str, ok: bool) -> None:
    """A runtime process said ready (``ok``) or could not be started."""
    SANDBOX_SPAWNS.labels(node=node, result="ok" if ok else "failed").inc()


def sandbox_spare(*, node: str, event: str) -> None:
    """Something happened to a spare: ``started``, ``failed``, ``handed_over``, ``died``."""
    SANDBOX_SPARES.labels(node=node, event=event).inc()


def sandbox_crashed(*, node: str) -> None:
    """A runtime process exited without PAW stopping it."""
    SANDBOX_CRASHES.labels(node=node).inc()


def sandbox_evicted(*, node: str) -> None:
    """An idle sandbox was stopped to make room for another."""
    SANDBOX_EVICTIONS.labels(node=node).inc()


def sandbox_idle_shutdown(*, node: str) -> None:
    """An idle sandbox is being shut down after its TTL."""
    SANDBOX_IDLE_SHUTDOWNS.labels(node=node).inc()


def relay_sent(*, arrivals: Iterable[float]) -> None:
    """Lines' events were sent; ``arrivals``: when each line reached the pipeline
    (``time.monotonic()``)."""
    now = time.monotonic()
    for arrived in arrivals:
        RELAY_READ_TO_SEND.observe(max(0.0, now - arrived))


def relay_stored(*, node: str, lines: int) -> None:
    """``lines`` runtime lines were stored as events by the node's pipeline."""
    if lines:
        RELAY_LINES_STORED.labels(node=node).inc(lines)


def live_appended(*, events: int) -> None:
    """``events`` events were appended to a live log."""
    RELAY_LIVE_APPENDS.inc(events)


def relay_delivered(*, sent_at: float | None, count: int = 1) -> None:
    """``count`` live events went out on a websocket; ``sent_at``: when they were sent
    (live-log append or channel-layer send), epoch seconds (``None`` from a sender that
    did not stamp it)."""
    if sent_at is not None:
        lag = max(0.0, time.time() - sent_at)
        for _ in range(count):
            RELAY_SEND_TO_CLIENT.observe(lag)


def channel_send(message_type: str) -> None:
    """A channel-layer group send (the type is PAW's own, e.g. ``conversation.events``)."""
    RELAY_CHANNEL_SENDS.labels(type=message_type).inc()


def events_replayed(*, reason: str, count: int) -> None:
    """A websocket sent ``count`` stored events from the database (see the metric)."""
    if count:
        RELAY_EVENTS_REPLAYED.labels(reason=reason).inc(count)


def approval_raised(*, kind: str) -> None:
    """An approval was created (call after commit)."""
    APPROVALS_RAISED.labels(kind=kind).inc()


def approval_decided(*, decided_by: str, status: str) -> None:
    """An approval was closed (call after commit)."""
    APPROVALS_DECIDED.labels(decided_by=decided_by, status=status).inc()


def tokens_used(*, provider: str, model: str, input: int, output: int, estimated: bool) -> None:
    """A finished run's tokens were billed (call after commit)."""
    labels = {
        "provider": _provider(provider),
        "model": _model(model),
        "source": "estimated" if estimated else "reported",
    }
    TOKENS.labels(direction="input", **labels).inc(max(0, input))
    TOKENS.labels(direction="output", **labels).inc(max(0, output))


def budget_refused(*, stage: str) -> None:
    """A budget refused a run: ``start`` (402) or ``run`` (stopped past it)."""
    BUDGET_REFUSALS.labels(stage=stage).inc()


def throttled(*, scope: str) -> None:
    """A rate limit refused a request or a websocket message."""
    THROTTLED.labels(scope=scope).inc()


def bearer_failed(*, kind: str) -> None:
    """A bearer token of ``kind`` (``personal`` or ``jwt``) did not authenticate."""
    BEARER_FAILURES.labels(kind=kind).inc()


# --- state read at scrape time ------------------------------------------------------------------


class _LiveSandboxes:
    """``paw_sandboxes{node, state}``: this node's live sandboxes, read from its pool at each
    scrape (the node registers its reader with :func:`sandboxes_reader`)."""

    def __init__(self) -> None:
        self.reader: tuple[str, Callable[[], dict[str, int]]] | None = None

    def describe(self) -> list[Metric]:
        return []  # read at scrape time; nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        reader = self.reader
        if reader is None:
            return
        node, read = reader
        counts = read()
        family = GaugeMetricFamily(
            "paw_sandboxes", "Live sandboxes of this node, by state.", labels=["node", "state"]
        )
        for state in SANDBOX_STATES:
            family.add_metric([node, state], counts.get(state, 0))
        yield family


_live_sandboxes = _LiveSandboxes()
REGISTRY.register(_live_sandboxes)


def sandboxes_reader(node: str | None, read: Callable[[], dict[str, int]] | None = None) -> None:
    """Report ``read()`` (``{state: count}``, states of :data:`SANDBOX_STATES`) as node
    ``node``'s live sandboxes; ``None`` stops (the node stopped)."""
    _live_sandboxes.reader = (node, read) if node is not None and read is not None else None
