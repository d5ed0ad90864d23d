"""A worker node: the sandboxes this Celery worker process owns, its event pipeline and its
monitor thread.

Started by the Celery ``worker_init`` signal and stopped by ``worker_shutdown`` (both are
sent by standalone workers and by the embedded worker), so :func:`current_node` exists
exactly in processes that consume the ``runs`` and ``sandbox.<node>`` queues.

The monitor, every ``MONITOR_INTERVAL`` seconds: expires approvals past their deadline
(a confirm is declined, a question answered "Unanswered"); cancels runs past
``PAW_RUN_TIMEOUT_SECONDS`` and kills them ``PAW_RUN_CANCEL_GRACE_SECONDS`` later if they
have not ended; shuts down sandboxes idle for ``PAW_SANDBOX_TTL_SECONDS``; and writes the
node's heartbeat, which Celery beat's reaper reads to tell live nodes from lost ones.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.utils import timezone

from conversations.models import Approval, Run
from conversations.services import approvals as approval_services
from conversations.services import runs as run_services
from sandboxes.models import Sandbox, WorkerNode
from sandboxes.pipeline import EventPipeline
from sandboxes.pool import SandboxError, SandboxPool, SandboxProcess, get_pool

logger = logging.getLogger(__name__)

MONITOR_INTERVAL = 0.5


class Node:
    """This process's node: name, pool, pipeline, monitor."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pool: SandboxPool = get_pool()
        self.pipeline = EventPipeline()
        self.pipeline.on_exit(self._forget)
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._last_heartbeat = 0.0
        self._last_db_refresh = time.monotonic()

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Register the node, clean up what a previous process of the same name left, and
        start the pipeline and the monitor."""
        now = timezone.now()
        WorkerNode.objects.update_or_create(
            name=self.name, defaults={"started_at": now, "heartbeat_at": now, "stopped_at": None}
        )
        self._recover(reason="the worker restarted during the run")
        self.pipeline.start()
        self._monitor = threading.Thread(
            target=self._monitor_loop, name="sandbox-monitor", daemon=True
        )
        self._monitor.start()
        logger.info("node %s started", self.name)

    def _recover(self, *, reason: str) -> None:
        """Runs and sandboxes a previous process of this node left behind are ended."""
        with transaction.atomic():
            Sandbox.objects.filter(node=self.name, state__in=Sandbox.LIVE_STATES).update(
                state=Sandbox.State.DEAD, stopped_at=timezone.now()
            )
        for run_id in Run.objects.filter(
            node=self.name, status__in=Run.ACTIVE_STATUSES
        ).values_list("id", flat=True):
            run_services.run_fail(run_id=run_id, code="worker_lost", message=reason)

    def stop(self, *, grace: float = 3.0) -> None:
        """Shut every sandbox down (their runs end ``error``: the worker stopped), store
        what they wrote, and mark the node stopped. No runtime process survives."""
        self._stop.set()
        sandboxes = self.pool.all()
        for sandbox in sandboxes:
            if sandbox.current_run is not None:
                sandbox.forced_outcome[sandbox.current_run] = (
                    "worker_stopped",
                    "the worker stopped during the run",
                )
        threads = [
            threading.Thread(target=sandbox.stop, kwargs={"grace": grace}, name="sandbox-stop")
            for sandbox in sandboxes
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(grace * 4)
        self.pipeline.drain(timeout=10)
        self.pipeline.stop()
        if self._monitor is not None:
            self._monitor.join(timeout=5)
        try:
            WorkerNode.objects.filter(name=self.name).update(stopped_at=timezone.now())
            Sandbox.objects.filter(node=self.name, state__in=Sandbox.LIVE_STATES).update(
                state=Sandbox.State.STOPPED, stopped_at=timezone.now()
            )
        finally:
            connection.close()
        logger.info("node %s stopped", self.name)

    def _forget(self, sandbox: SandboxProcess) -> None:
        self.pool.discard(sandbox)

    # --- monitor ------------------------------------------------------------------------

    def _monitor_loop(self) -> None:
        while not self._stop.wait(MONITOR_INTERVAL):
            try:
                self._tick()
            except Exception:
                logger.exception("sandbox monitor: tick failed")
                connection.close()
        connection.close()

    def _tick(self) -> None:
        now = time.monotonic()
        if now - self._last_db_refresh > 30:
            close_old_connections()
            self._last_db_refresh = now
        self._expire_approvals()
        for sandbox in self.pool.all():
            self._check_sandbox(sandbox, now)
        if now - self._last_heartbeat >= settings.PAW_NODE_HEARTBEAT_SECONDS:
            self._heartbeat()
            self._last_heartbeat = now

    def _check_sandbox(self, sandbox: SandboxProcess, now: float) -> None:
        run_id = sandbox.current_run
        grace = settings.PAW_RUN_CANCEL_GRACE_SECONDS
        if run_id is not None:
            forced_at = sandbox.forced_at
            if (
                run_id in sandbox.forced_outcome
                and forced_at is not None
                and now - forced_at > grace
            ):
                logger.warning(
                    "sandbox %s: run %s did not stop after cancel; killing it",
                    sandbox.sandbox_id,
                    run_id,
                )
                sandbox.kill()
            elif now - sandbox.run_started > settings.PAW_RUN_TIMEOUT_SECONDS:
                sandbox.force_end(
                    run_id,
                    code="timeout",
                    message=f"the run took longer than {settings.PAW_RUN_TIMEOUT_SECONDS} s",
                )
        elif not sandbox.stopping and now - sandbox.last_active > settings.PAW_SANDBOX_TTL_SECONDS:
            logger.info(
                "sandbox %s idle for %.0f s: shutting down",
                sandbox.sandbox_id,
                now - sandbox.last_active,
            )
            sandbox.stopping = True
            threading.Thread(target=sandbox.stop, name="sandbox-idle-stop", daemon=True).start()

    def _expire_approvals(self) -> None:
        due = list(
            Approval.objects.filter(
                status=Approval.Status.PENDING, expires_at__lte=timezone.now(), run__node=self.name
            ).values_list("id", flat=True)[:100]
        )
        for approval_id in due:
            approval = approval_services.approval_expire(approval_id=approval_id)
            if approval is not None:
                deliver_answer(self, approval)

    def _heartbeat(self) -> None:
        now = timezone.now()
        WorkerNode.objects.filter(name=self.name).update(heartbeat_at=now)
        ids = [s.sandbox_id for s in self.pool.all()]
        if ids:
            Sandbox.objects.filter(id__in=ids, state__in=Sandbox.LIVE_STATES).update(
                heartbeat_at=now
            )


def deliver_answer(node: Node, approval: Approval) -> bool:
    """Write the ``answer`` op for a decided approval to its run's sandbox on this node.
    Returns ``False`` when the run is no longer the sandbox's current run."""
    sandbox = node.pool.get(approval.conversation_id)
    if sandbox is None or sandbox.current_run != approval.run_id:
        return False
    try:
        sandbox.send(
            "answer",
            run_id=str(approval.run_id),
            answers=approval_services.approval_answers(approval),
            ask_id=approval.ask_id or None,
        )
    except SandboxError:
        return False
    return True


_node: Node | None = None
_node_lock = threading.Lock()


def node_start(name: str | None = None) -> Node:
    """Start this process's node (idempotent)."""
    global _node
    with _node_lock:
        if _node is None:
            _node = Node(name or settings.PAW_NODE_NAME)
            _node.start()
        return _node


def node_stop() -> None:
    """Stop this process's node, if started."""
    global _node
    with _node_lock:
        node, _node = _node, None
    if node is not None:
        node.stop()


def current_node() -> Node:
    """This process's node; ``RuntimeError`` outside a worker."""
    if _node is None:
        raise RuntimeError("no sandbox node runs in this process (not a Celery worker)")
    return _node
