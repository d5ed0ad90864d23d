"""Liveness and readiness probes for load balancers and orchestrators.

``GET /healthz``: 200 while the process serves requests (it checks nothing else).
``GET /readyz``: 200 only when the database, the Celery broker, the channel layer and at
least one live Celery worker answer; else 503 with a JSON body naming what failed, e.g.
``{"status": "unavailable", "checks": {"database": "unavailable", "broker": "ok", ...}}``.
Why a check failed (driver errors name hosts and ports) goes to the log, not to the
anonymous caller.

Probes must stay cheap and bounded however many arrive and whatever is down:

* one probe at a time runs the checks; probes arriving meanwhile (or within
  ``RESULT_TTL`` seconds after) answer with its result;
* the checks run in parallel, each in its own daemon thread, and the probe waits at most
  ``CHECK_TIMEOUT`` seconds for them: a check still hanging then counts as failed, and
  later probes wait for that same attempt instead of starting another one;
* the worker ping uses a connection of its own (Celery's ``control.ping`` otherwise holds
  one connection of the broker pool while it waits for a second from the same pool, which
  deadlocks once the pool is exhausted by concurrent probes); in embedded mode the worker
  is the thread next door, so it is looked at directly instead of pinged.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_safe

from paw_project.celery import app as celery_app

logger = logging.getLogger(__name__)

#: Seconds the checks of one probe may take together (they run in parallel).
CHECK_TIMEOUT = 2.0
#: Seconds a result answers the probes that follow it.
RESULT_TTL = 1.5
#: Seconds to wait for a worker's reply to a broadcast ping (Redis mode).
WORKER_PING_TIMEOUT = 1.0
#: Seconds a connection attempt to the broker may take.
BROKER_CONNECT_TIMEOUT = 1.5


def _check_database() -> None:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    finally:
        # The check runs in a thread of its own: give the connection back (to the pool).
        connection.close()


def _check_broker() -> None:
    with celery_app.connection_for_write(connect_timeout=BROKER_CONNECT_TIMEOUT) as conn:
        conn.ensure_connection(max_retries=0)


def _check_channel_layer() -> None:
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer configured")

    async def send() -> None:
        await asyncio.wait_for(layer.group_send("paw.readyz", {"type": "readyz.probe"}), 1.5)

    asyncio.run(send())


def _check_worker() -> None:
    if settings.EMBEDDED:
        from paw_project.embedded import running_worker

        worker = running_worker()
        if worker is None or not worker.is_consuming():
            raise RuntimeError("the embedded worker of this process is not consuming")
        return
    with celery_app.connection_for_write(connect_timeout=BROKER_CONNECT_TIMEOUT) as conn:
        replies = celery_app.control.ping(timeout=WORKER_PING_TIMEOUT, limit=1, connection=conn)
    if not replies:
        raise RuntimeError("no worker answered a ping")


CHECKS: dict[str, Callable[[], None]] = {
    "database": _check_database,
    "broker": _check_broker,
    "channel_layer": _check_channel_layer,
    "worker": _check_worker,
}

_probe_lock = threading.Lock()
_last_result: tuple[float, dict[str, str]] | None = None
_attempts: dict[str, Future] = {}


def _start(name: str, check: Callable[[], None]) -> Future:
    """Run ``check`` in a daemon thread (a hung check never delays the process exit)."""
    future: Future = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            future.set_result(check())
        except BaseException as exc:  # reported by the probe
            future.set_exception(exc)

    threading.Thread(target=run, name=f"readyz-{name}", daemon=True).start()
    return future


def _run_checks() -> dict[str, str]:
    for name, check in CHECKS.items():
        previous = _attempts.get(name)
        if previous is None or previous.done():
            _attempts[name] = _start(name, check)
    deadline = time.monotonic() + CHECK_TIMEOUT
    results: dict[str, str] = {}
    for name in CHECKS:
        try:
            _attempts[name].result(timeout=max(0.0, deadline - time.monotonic()))
            results[name] = "ok"
        except FutureTimeout:
            logger.warning("readiness check %s: no answer within %.0f s", name, CHECK_TIMEOUT)
            results[name] = "unavailable"
        except Exception as exc:
            logger.warning("readiness check %s failed: %s", name, exc or exc.__class__.__name__)
            results[name] = "unavailable"
    return results


def readiness() -> dict[str, str]:
    """``{check name: "ok" | "unavailable"}``, at most ``CHECK_TIMEOUT`` seconds (plus the
    wait for a probe already running) after the call."""
    global _last_result
    if not _probe_lock.acquire(timeout=CHECK_TIMEOUT + 1.0):
        return {name: "unavailable" for name in CHECKS}  # unreachable while checks are bounded
    try:
        if _last_result is not None and time.monotonic() - _last_result[0] < RESULT_TTL:
            return _last_result[1]
        results = _run_checks()
        _last_result = (time.monotonic(), results)
        return results
    finally:
        _probe_lock.release()


def sandbox_network() -> str:
    """The sandboxes' network as this process's settings make it (``isolated`` or
    ``host``, ``PAW_SANDBOX_NETWORK``; ``unavailable`` when the sandbox isolation itself
    is, e.g. bubblewrap missing). Each worker node's own is in the admin (worker nodes)."""
    from sandboxes.launch import IsolationUnavailable, network_mode

    try:
        return network_mode()
    except (IsolationUnavailable, RuntimeError):
        return "unavailable"


@csrf_exempt
@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """200 ``{"status": "ok"}`` while the process serves."""
    return JsonResponse({"status": "ok"})


@csrf_exempt
@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when every dependency answers, else 503 naming each failed check."""
    results = readiness()
    ready = all(value == "ok" for value in results.values())
    response = JsonResponse(
        {
            "status": "ok" if ready else "unavailable",
            "checks": results,
            "sandbox_network": sandbox_network(),
        },
        status=200 if ready else 503,
    )
    if not ready:
        # Each failed check was logged once at WARNING with its cause; Django's own ERROR
        # line for a 5xx would only repeat "Service Unavailable" on every probe.
        response._has_been_logged = True
    return response
