"""A worker node: the sandboxes this Celery worker process owns, its event pipeline and its
monitor thread.

Started by the Celery ``worker_init`` signal and stopped by ``worker_shutdown`` (both are
sent by standalone workers and by the embedded worker), so :func:`current_node` exists
exactly in processes that consume the ``runs`` and ``sandbox.<node>`` queues.

The monitor, every ``MONITOR_INTERVAL`` seconds: expires approvals past their deadline
(a confirm is declined, a question answered "Unanswered"); cancels runs past
``PAW_RUN_TIMEOUT_SECONDS``; writes a cancelled run's ``cancel`` again every second until
it ends, and kills the sandbox of any run still going ``PAW_RUN_CANCEL_GRACE_SECONDS``
after its cancel (the host's or somebody's); shuts down sandboxes idle for
``PAW_SANDBOX_TTL_SECONDS``; and writes the node's heartbeat, which Celery beat's reaper
reads to tell live nodes from lost ones.
"""

from __future__ import annotations

import logging
import threading
import time

from django.conf import settings
from django.db import close_old_connections, connection
from django.utils import timezone

from conversations.selectors import runs as run_selectors
from conversations.selectors.runs import AnswerOp
from conversations.services import approvals as approval_services
from conversations.services import runs as run_services
from paw_project import metrics
from sandboxes import records
from sandboxes.launch import IsolationUnavailable, network_mode
from sandboxes.pipeline import EventPipeline
from sandboxes.pool import SandboxPool, get_pool
from sandboxes.process import SandboxProcess
from sandboxes.reader import OutputReader, output_reader
from sandboxes.run import CANCEL_RESEND_SECONDS, SandboxError
from sandboxes.spares import SpareKeeper

logger = logging.getLogger(__name__)

MONITOR_INTERVAL = 0.5
#: Seconds each step of a sandbox's shutdown gets when its node stops (shutdown op, SIGTERM,
#: SIGKILL; then its reader threads).
SANDBOX_STOP_GRACE = 3.0
#: Seconds a stopping node waits at most for its pipeline to store what was read.
PIPELINE_DRAIN_SECONDS = 10.0
#: Seconds a node's stop can take at most: its sandboxes and spares stopped in parallel
#: (five ``SANDBOX_STOP_GRACE`` waits), the pipeline drained and stopped (three waits), the
#: monitor's end. A service manager's stop timeout for a worker must be longer, plus the
#: running tasks Celery lets finish first (see deploy/systemd/paw-worker.service). (The
#: spares' refill thread, if it is starting one right then, ends as soon as that one is
#: stopped.)
STOP_SECONDS_MAX = 5 * SANDBOX_STOP_GRACE + 3 * PIPELINE_DRAIN_SECONDS + 5.0


class Node:
    """This process's node: name, pool, the reader of its sandboxes' stdout, spares,
    pipeline, monitor."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.pool: SandboxPool = get_pool()
        self.reader: OutputReader = output_reader()
        self.spares = SpareKeeper(name, self.pool, self.reader)
        self.pipeline = EventPipeline(node=name)
        self.pipeline.on_exit(self._forget)
        self._stop = threading.Event()
        self._monitor: threading.Thread | None = None
        self._last_heartbeat = 0.0
        self._last_db_refresh = time.monotonic()

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Register the node, clean up what a previous process of the same name left, and
        start the pipeline and the monitor."""
        try:
            network = network_mode()
        except (IsolationUnavailable, RuntimeError):
            network = ""  # the node cannot start sandboxes at all; each start says why
        records.node_register(name=self.name, network=network)
        self._recover(reason="the worker restarted during the run")
        self.pipeline.start()
        self.spares.start()
        self._monitor = threading.Thread(
            target=self._monitor_loop, name="sandbox-monitor", daemon=True
        )
        self._monitor.start()
        logger.info("node %s started", self.name)

    def _recover(self, *, reason: str) -> None:
        """Runs and sandboxes a previous process of this node left behind are ended."""
        records.nodes_sandboxes_mark_dead(nodes=[self.name])
        for run_id in run_selectors.run_ids_active_on_nodes(nodes=[self.name]):
            run_services.run_fail(run_id=run_id, code="worker_lost", message=reason)

    def stop(self, *, grace: float = SANDBOX_STOP_GRACE) -> None:
        """Shut every sandbox and spare down (their runs end ``error``: the worker
        stopped), store what they wrote, and mark the node stopped. No runtime process
        survives."""
        self._stop.set()
        sandboxes = self.pool.all()
        for sandbox in sandboxes:
            if sandbox.active is not None:
                sandbox.active.mark_forced(
                    code="worker_stopped", message="the worker stopped during the run"
                )
        threads = [
            threading.Thread(target=sandbox.stop, kwargs={"grace": grace}, name="sandbox-stop")
            for sandbox in [*sandboxes, *self.spares.halt()]
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(grace * 4)
        self.spares.join(grace=grace)
        self.pipeline.drain(timeout=PIPELINE_DRAIN_SECONDS)
        self.pipeline.stop(timeout=PIPELINE_DRAIN_SECONDS)
        if self._monitor is not None:
            self._monitor.join(timeout=5)
        try:
            records.node_mark_stopped(name=self.name)
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
        run = sandbox.active
        grace = settings.PAW_RUN_CANCEL_GRACE_SECONDS
        if run is not None:
            asked = min(t for t in (run.forced_at, run.cancel_sent_at, now) if t is not None)
            if now - asked > grace:
                logger.warning(
                    "sandbox %s: run %s did not stop after cancel; killing it",
                    sandbox.sandbox_id,
                    run.run_id,
                )
                sandbox.kill()
            elif (
                run.cancel_resent_at is not None
                and now - run.cancel_resent_at >= CANCEL_RESEND_SECONDS
            ):
                run.cancel()  # missed it? (a runtime still setting the run up may)
            elif now - run.started > settings.PAW_RUN_TIMEOUT_SECONDS:
                run.force_end(
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
            metrics.sandbox_idle_shutdown(node=self.name)
            threading.Thread(target=sandbox.stop, name="sandbox-idle-stop", daemon=True).start()

    def _expire_approvals(self) -> None:
        for approval_id in run_selectors.approval_ids_due(node=self.name, now=timezone.now()):
            approval = approval_services.approval_expire(approval_id=approval_id)
            if approval is not None:
                self.answer_deliver(run_selectors.approval_answer_op(approval))

    def answer_deliver(self, op: AnswerOp) -> bool:
        """Write the ``answer`` op ``op`` (a decided approval's) to its run's sandbox here;
        one approving an ``install_package`` call opens the package index for it
        (:class:`~sandboxes.package_index.PackageIndexWindow`). Returns ``False`` when the
        run is no longer the sandbox's current run, or the sandbox is gone."""
        sandbox = self.pool.get(op.conversation_id)
        run = sandbox.active if sandbox is not None else None
        if run is None or run.run_id != op.run_id:
            return False
        try:
            sandbox.package_index.answer(
                approved_call=op.approved_call,
                write=lambda: run.answer(answers=op.answers, ask_id=op.ask_id),
            )
        except SandboxError:
            return False
        return True

    def _heartbeat(self) -> None:
        records.node_heartbeat(name=self.name, sandbox_ids=[s.sandbox_id for s in self.pool.all()])


_node: Node | None = None
_node_lock = threading.Lock()


def node_start(name: str | None = None) -> Node:
    """Start this process's node (idempotent)."""
    global _node
    with _node_lock:
        if _node is None:
            _node = Node(name or settings.PAW_NODE_NAME)
            _node.start()
            metrics.sandboxes_reader(_node.name, _node.pool.state_counts)
        return _node


def node_stop() -> None:
    """Stop this process's node, if started."""
    global _node
    with _node_lock:
        node, _node = _node, None
    if node is not None:
        metrics.sandboxes_reader(None)
        node.stop()


def current_node() -> Node:
    """This process's node; ``RuntimeError`` outside a worker."""
    if _node is None:
        raise RuntimeError("no sandbox node runs in this process (not a Celery worker)")
    return _node
