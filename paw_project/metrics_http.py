"""Where Prometheus scrapes PAW: ``GET /metrics`` on every web process, and a small HTTP
endpoint of each worker node (``PAW_WORKER_METRICS_PORT``).

One endpoint per process (not prometheus_client's multiprocess mode; docs/operations.md
says why): each answers with its own process's registry (:mod:`paw_project.metrics` and
django-prometheus's HTTP metrics). A web process adds what waits across the whole
installation, read from the database at each scrape (``paw_runs_queued``,
``paw_approvals_pending``: the same on every web process, so dashboards take ``max``).
An embedded PAW is one process: its ``/metrics`` has everything, the node's included.

Both endpoints answer only ``Authorization: Bearer <PAW_METRICS_TOKEN>``; ``/metrics``
also a signed-in staff session (a person looking from the browser). Anything else gets
``401 {"detail", "code": "not_authenticated"}`` with ``WWW-Authenticate: Bearer``.
"""

from __future__ import annotations

import hmac
import json
import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from django.conf import settings
from django.db import DatabaseError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe
from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, REGISTRY, CollectorRegistry, generate_latest
from prometheus_client import make_wsgi_app as prometheus_wsgi_app
from prometheus_client.core import GaugeMetricFamily, Metric

from conversations.selectors.runs import waiting_counts

logger = logging.getLogger(__name__)

_UNAUTHORIZED = {
    "detail": "Metrics need Authorization: Bearer <PAW_METRICS_TOKEN> or a staff session.",
    "code": "not_authenticated",
}
_CHALLENGE = 'Bearer realm="metrics"'


def token_authorized(header: str | None) -> bool:
    """Whether an ``Authorization`` header value carries ``PAW_METRICS_TOKEN`` (compared in
    constant time; never with an empty token)."""
    token = settings.PAW_METRICS_TOKEN
    scheme, _, given = (header or "").partition(" ")
    return (
        bool(token)
        and scheme.lower() == "bearer"
        and hmac.compare_digest(given.strip().encode(), token.encode())
    )


class _Waiting:
    """``paw_runs_queued`` and ``paw_approvals_pending``, counted in the database at each
    scrape (web processes only: one source, whatever the number of nodes)."""

    def collect(self) -> Iterator[Metric]:
        try:
            counts = waiting_counts()
        except DatabaseError as exc:  # the process's own metrics still answer
            logger.warning("metrics: could not count waiting runs and approvals: %s", exc)
            return
        yield GaugeMetricFamily(
            "paw_runs_queued", "Runs queued now (all nodes).", value=counts["runs_queued"]
        )
        yield GaugeMetricFamily(
            "paw_approvals_pending",
            "Approvals waiting for a decision now (all nodes).",
            value=counts["approvals_pending"],
        )


_WAITING = CollectorRegistry(auto_describe=False)
_WAITING.register(_Waiting())


@csrf_exempt
@never_cache
@require_safe
def metrics(request: HttpRequest) -> HttpResponse:
    """This process's metrics in the Prometheus text format (0.0.4), plus what waits
    across the installation; 401 without the token or a staff session."""
    staff = request.user.is_authenticated and request.user.is_staff
    if not staff and not token_authorized(request.headers.get("Authorization")):
        response = JsonResponse(_UNAUTHORIZED, status=401)
        response["WWW-Authenticate"] = _CHALLENGE
        return response
    body = generate_latest(REGISTRY) + generate_latest(_WAITING)
    return HttpResponse(body, content_type=CONTENT_TYPE_PLAIN_0_0_4)


# --- a worker node's endpoint -------------------------------------------------------------------


def worker_app(registry: CollectorRegistry = REGISTRY) -> Callable[..., Iterable[bytes]]:
    """The WSGI application of a worker node's endpoint: ``GET /metrics`` with the token
    (prometheus_client's own exposition: text format, gzip, ``name[]`` filters), 401
    without it, 404 elsewhere."""
    exposition = prometheus_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if not token_authorized(environ.get("HTTP_AUTHORIZATION")):
            body = json.dumps(_UNAUTHORIZED).encode()
            start_response(
                "401 Unauthorized",
                [("Content-Type", "application/json"), ("WWW-Authenticate", _CHALLENGE)],
            )
            return [body]
        if environ.get("PATH_INFO") != "/metrics":
            start_response("404 Not Found", [("Content-Type", "application/json")])
            return [json.dumps({"detail": "Only /metrics here.", "code": "not_found"}).encode()]
        return exposition(environ, start_response)

    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in progress never holds the worker's exit


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access line per scrape (wsgiref writes them to stderr)."""


class WorkerMetricsServer:
    """The worker node's endpoint on ``host:port``, served by daemon threads."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Listen and serve. Raises ``OSError`` when the address cannot be bound."""
        self._server = make_server(
            self.host, self.port, worker_app(), _ThreadingServer, handler_class=_QuietHandler
        )
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-http", daemon=True
        )
        self._thread.start()
        logger.info("metrics: serving this node's metrics on %s:%s/metrics", self.host, self.port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


_worker_server: WorkerMetricsServer | None = None


def worker_server_start() -> None:
    """Start this worker node's endpoint when ``PAW_WORKER_METRICS_PORT`` is set (never in
    embedded mode: there ``/metrics`` has the node's metrics). A port that cannot be bound
    is logged as an error; the node runs on without it."""
    global _worker_server
    if settings.EMBEDDED or not settings.PAW_WORKER_METRICS_PORT or _worker_server is not None:
        return
    server = WorkerMetricsServer(settings.PAW_WORKER_METRICS_HOST, settings.PAW_WORKER_METRICS_PORT)
    try:
        server.start()
    except OSError as exc:
        logger.error(
            "metrics: cannot listen on %s:%s (%s); this node's metrics are not served",
            server.host,
            server.port,
            exc.strerror or exc,
        )
        return
    _worker_server = server


def worker_server_stop() -> None:
    """Stop this worker node's endpoint, if it runs."""
    global _worker_server
    server, _worker_server = _worker_server, None
    if server is not None:
        server.stop()
