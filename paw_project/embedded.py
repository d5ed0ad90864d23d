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

from celery import bootsteps
from django.conf import settings

from paw_project.celery import app
from sandboxes.enqueue import node_queues

logger = logging.getLogger(__name__)


_running: EmbeddedWorker | None = None


def running_worker() -> EmbeddedWorker | None:
    """The embedded worker started in this process, if any (what ``/readyz`` looks at in
    embedded mode)."""
    return _running


class EmbeddedWorker:
    """A Celery worker (threads pool) and beat scheduler running in background threads.

    ``start()`` returns once the worker consumes its queues (or raises ``RuntimeError``
    after ``timeout`` seconds); ``stop()`` performs a warm shutdown and waits for it, but
    never longer than its ``timeout``.
    """

    def __init__(self, *, concurrency: int | None = None, beat: bool = True) -> None:
        self.concurrency = concurrency or settings.PAW_WORKER_CONCURRENCY
        self.with_beat = beat
        self.worker = None
        self.beat = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()

    def start(self, timeout: float = 30.0) -> None:
        global _running
        self.worker = app.WorkController(
            pool="threads",
            concurrency=self.concurrency,
            hostname=f"paw@{settings.PAW_NODE_NAME}",
            queues=node_queues(settings.PAW_NODE_NAME),
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
        _running = self
        logger.info(
            "embedded worker ready on queues %s", ", ".join(node_queues(settings.PAW_NODE_NAME))
        )

    def _on_ready(self, consumer) -> None:
        # Celery's default callback starts the consumer's event loop; keep that.
        self.worker.on_consumer_ready(consumer)
        self._ready.set()

    def is_consuming(self) -> bool:
        """Whether the worker thread is alive and its consumer runs (takes tasks)."""
        worker = self.worker
        consumer = getattr(worker, "consumer", None)
        return (
            self._thread is not None
            and self._thread.is_alive()
            and worker is not None
            and worker.blueprint is not None
            and worker.blueprint.state == bootsteps.RUN
            and consumer is not None
            and consumer.blueprint is not None
            and consumer.blueprint.state == bootsteps.RUN
        )

    def stop(self, timeout: float = 30.0) -> bool:
        """Stop beat and the worker (its sandboxes too), waiting at most ``timeout``
        seconds in all. Returns ``False`` when something was still running then.

        Beat's own ``stop()`` waits without a limit for a flag its thread sets only after
        saving the schedule, which never comes if saving failed (``var/`` removed), so
        beat is only told to stop here and its thread joined with a timeout."""
        global _running
        if _running is self:
            _running = None
        deadline = time.monotonic() + timeout
        if self.beat is not None:
            self.beat.service.stop(wait=False)
        stopper = None
        if self.worker is not None:
            # A warm shutdown waits for running tasks and stops the node's sandboxes.
            stopper = threading.Thread(
                target=self.worker.stop,
                kwargs={"in_sighandler": False},
                name="celery-embedded-stop",
                daemon=True,
            )
            stopper.start()
        stopped = True
        for thread in (stopper, self._thread, self.beat):
            if thread is not None:
                thread.join(max(0.0, deadline - time.monotonic()))
                if thread.is_alive():
                    logger.warning(
                        "embedded worker: %s did not stop within %.0f s", thread.name, timeout
                    )
                    stopped = False
        return stopped
