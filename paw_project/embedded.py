"""Embedded mode: a Celery worker and beat running as threads of the web process.

Used when ``PAW_REDIS_URL`` is empty (``make run`` on a bare laptop): the broker is Kombu's
in-memory transport, which only works inside one process, so the worker must live in the
process that enqueues. The worker is Celery's own ``WorkController`` with the threads pool,
consuming the same queues as a standalone node (``runs`` and ``sandbox.<node>``); it
sends the same ``worker_init``/``worker_shutdown`` signals, so node start-up and sandbox
shutdown hooks behave the same in both modes.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings

from paw_project.celery import app

logger = logging.getLogger(__name__)


def node_queues(node: str | None = None) -> list[str]:
    """The queues a worker node consumes: the shared ``runs`` queue and its own
    ``sandbox.<node>`` queue (where the ops for its sandboxes are routed)."""
    return ["runs", f"sandbox.{node or settings.PAW_NODE_NAME}"]


class EmbeddedWorker:
    """A Celery worker (threads pool) and beat scheduler running in background threads.

    ``start()`` returns once the worker consumes its queues (or raises ``RuntimeError``
    after ``timeout`` seconds); ``stop()`` performs a warm shutdown and waits for it.
    """

    def __init__(self, *, concurrency: int | None = None, beat: bool = True) -> None:
        self.concurrency = concurrency or settings.PAW_WORKER_CONCURRENCY
        self.with_beat = beat
        self.worker = None
        self.beat = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self, timeout: float = 30.0) -> None:
        self.worker = app.WorkController(
            pool="threads",
            concurrency=self.concurrency,
            hostname=f"paw@{settings.PAW_NODE_NAME}",
            queues=node_queues(),
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
            loglevel=settings.PAW_LOG_LEVEL,
            ready_callback=self._on_ready,
        )
        self._thread = threading.Thread(
            target=self.worker.start, name="celery-embedded", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(timeout):
            raise RuntimeError(f"the embedded Celery worker did not start within {timeout:.0f} s")
        if self.with_beat:
            from celery.beat import EmbeddedService

            self.beat = EmbeddedService(app, thread=True)
            self.beat.start()
        logger.info("embedded worker ready on queues %s", ", ".join(node_queues()))

    def _on_ready(self, consumer) -> None:
        # Celery's default callback starts the consumer's event loop; keep that.
        self.worker.on_consumer_ready(consumer)
        self._ready.set()

    def stop(self, timeout: float = 30.0) -> None:
        if self.beat is not None:
            self.beat.stop()
        if self.worker is not None:
            self.worker.stop(in_sighandler=False)
        if self._thread is not None:
            deadline = time.monotonic() + timeout
            self._thread.join(max(0.0, deadline - time.monotonic()))
