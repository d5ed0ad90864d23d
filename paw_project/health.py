"""Liveness and readiness probes for load balancers and orchestrators.

``GET /healthz``: 200 while the process serves requests (it checks nothing else).
``GET /readyz``: 200 only when the database, the Celery broker, the channel layer and at
least one live Celery worker answer; else 503 with a JSON body naming what failed, e.g.
``{"status": "unavailable", "checks": {"database": "ok", "worker": "no worker answered"}}``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe

from paw_project.celery import app as celery_app

logger = logging.getLogger(__name__)

# Seconds to wait for a worker's reply to a broadcast ping.
WORKER_PING_TIMEOUT = 1.0


def _check_database() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def _check_broker() -> None:
    with celery_app.connection_for_write() as conn:
        conn.ensure_connection(max_retries=1, timeout=2)


def _check_channel_layer() -> None:
    layer = get_channel_layer()
    if layer is None:
        raise RuntimeError("no channel layer configured")
    async_to_sync(layer.group_send)("paw.readyz", {"type": "readyz.probe"})


def _check_worker() -> None:
    replies = celery_app.control.ping(timeout=WORKER_PING_TIMEOUT, limit=1)
    if not replies:
        raise RuntimeError("no worker answered")


CHECKS: dict[str, Callable[[], None]] = {
    "database": _check_database,
    "broker": _check_broker,
    "channel_layer": _check_channel_layer,
    "worker": _check_worker,
}


@never_cache
@require_safe
def healthz(request: HttpRequest) -> JsonResponse:
    """200 ``{"status": "ok"}`` while the process serves."""
    return JsonResponse({"status": "ok"})


@never_cache
@require_safe
def readyz(request: HttpRequest) -> JsonResponse:
    """200 when every dependency answers, else 503 naming each failed check."""
    results: dict[str, str] = {}
    for name, check in CHECKS.items():
        try:
            check()
            results[name] = "ok"
        except Exception as exc:  # a probe reports, it never raises
            logger.warning("readiness check %s failed: %s", name, exc)
            results[name] = str(exc) or exc.__class__.__name__
    ready = all(value == "ok" for value in results.values())
    return JsonResponse(
        {"status": "ok" if ready else "unavailable", "checks": results},
        status=200 if ready else 503,
    )
