"""Spare sandboxes: ready ``paw-agent`` processes a node keeps for new conversations.

A new conversation's first run waits for a runtime process: its spawn under bubblewrap,
then, before the first model call, the ``openai`` SDK's import (about 0.6 s of CPU). A
spare has done both before anybody needs it, and is handed over to the next new
conversation (:func:`sandboxes.services.sandbox_handover`). ``docs/runtime.md`` (Spare
sandboxes) has the whole design; in short:

- **Nothing of a person before the hand-over.** A spare is ``paw-agent serve --spare``
  started with the spare's own :class:`~sandboxes.launch.SandboxSpec`: an empty folder
  ``<PAW_WORKSPACE_ROOT>/.spares/<node>/<id>/``, the base environment and no variable of
  any run, a network plan that allows nothing (:func:`~sandboxes.network.spare_plan`),
  its secrets pipe open and empty. It has no ``Sandbox`` row.
- **At the hand-over** the spare's folder is renamed to the conversation's workspace
  (only when that is missing or empty: an upload that came first keeps the normal
  spawn), its row is made, its forwarder gets the run's plan, and the runtime reads the
  run's variables from its secrets pipe (:meth:`SandboxProcess.hand_over`). From then on
  it is that conversation's sandbox like any other, and never a spare again: a spare is
  used once.
- **Room**: spares count against ``PAW_MAX_SANDBOXES_PER_NODE`` (the node never runs more
  runtime processes than that); they only fill room no conversation uses, and a spawn
  that needs room retires a spare before it evicts anybody's idle sandbox. A hand-over
  changes nothing to the count.
- **Refill**: one thread per node starts a spare whenever there are fewer than
  ``PAW_SANDBOX_SPARES`` and there is room: after a hand-over, after a spare died, at the
  node's start. A spare that fails to start is retried after a growing pause.
- **Only paw-agent** (``PAW_HARNESS_CMD``): python-agent-harness and other runtimes get no
  spares and are spawned as before.
- **Stopped with the node** (:meth:`SpareKeeper.halt` then :meth:`SpareKeeper.join`); a
  spare, like every sandbox, also dies with the worker process (bubblewrap's
  ``--die-with-parent``, or its keeper).
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
import uuid
from pathlib import Path

from django.conf import settings

from paw_project import metrics
from sandboxes.launch import IsolationUnavailable, SandboxSpec, isolation_mode, runtime_kind
from sandboxes.pool import SandboxPool, ready_timeout
from sandboxes.process import SandboxProcess
from sandboxes.reader import OutputReader
from sandboxes.run import SandboxError

logger = logging.getLogger(__name__)

#: The folder, under ``PAW_WORKSPACE_ROOT``, of every node's spares (one folder per node).
SPARES_DIR = ".spares"
#: Seconds between two looks at the spares when nothing happened (a missed wake-up).
REFILL_CHECK_SECONDS = 5.0
#: Seconds to wait after a spare failed to start, by consecutive failures (then the last).
RETRY_DELAYS = (1.0, 5.0, 30.0, 60.0)


def spares_folder(node: str) -> Path:
    """The folder of node ``node``'s spares: ``<PAW_WORKSPACE_ROOT>/.spares/<node>``. It is
    on the workspaces' file system, so a spare's folder can be renamed into a
    conversation's workspace."""
    return Path(settings.PAW_WORKSPACE_ROOT) / SPARES_DIR / node.replace("/", "_")


class SpareKeeper:
    """The spares of one node: started by its refill thread, handed out by :meth:`take`.

    ``size`` is how many the node keeps (``PAW_SANDBOX_SPARES``; 0 when the runtime is not
    paw-agent or sandboxes cannot start here at all). The spares themselves are counted in
    ``pool`` (:meth:`SandboxPool.spares`), with the node's other sandboxes.
    """

    def __init__(self, node: str, pool: SandboxPool, reader: OutputReader) -> None:
        self.node = node
        self.pool = pool
        #: Reads the spares' stdout (the node's).
        self.reader = reader
        self.folder = spares_folder(node)
        self.size = 0
        self._wanted = threading.Event()
        self._halted = threading.Event()
        self._thread: threading.Thread | None = None

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        """Remove what a previous process of this node left in its spares' folder and, when
        spares are wanted, start the refill thread (which starts the first ones)."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self.size = self._wanted_size()
        if not self.size:
            return
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._refill, name="sandbox-spares", daemon=True)
        self._thread.start()
        logger.info("node %s keeps %d spare runtime(s)", self.node, self.size)

    def _wanted_size(self) -> int:
        size = settings.PAW_SANDBOX_SPARES
        if not size:
            return 0
        try:
            isolation_mode()
            kind = runtime_kind()
        except (FileNotFoundError, IsolationUnavailable, RuntimeError) as exc:
            logger.warning("node %s keeps no spare runtime: %s", self.node, exc)
            return 0
        if kind != "paw-agent":
            logger.info("node %s keeps no spare: only paw-agent can be one", self.node)
            return 0
        return size

    def halt(self) -> list[SandboxProcess]:
        """Stop starting spares and give up the ones there are (the node stops): returns
        them, for the caller to stop with its other sandboxes. A spare the refill thread
        is starting meanwhile is left to :meth:`join`."""
        with self.pool.capacity:
            self._halted.set()
        self._wanted.set()
        spares = self.pool.spares()
        for spare in spares:
            self.pool.spare_discard(spare)
        return spares

    def join(self, *, grace: float) -> None:
        """After :meth:`halt` and the stop of the spares it returned: wait for the refill
        thread to end, stop any spare it was still starting, remove the spares' folder.
        No spare process is left when this returns."""
        if self._thread is not None:
            self._thread.join(ready_timeout() + grace)
        for spare in self.pool.spares():
            self.pool.spare_discard(spare)
            spare.stop(grace=grace)
        shutil.rmtree(self.folder, ignore_errors=True)

    def wake(self) -> None:
        """Ask the refill thread to look again (a spare was taken or died, room was made)."""
        self._wanted.set()

    # --- handing out --------------------------------------------------------------------

    def take(self) -> SandboxProcess | None:
        """A ready spare for a hand-over, or ``None`` when there is none. It is no longer
        counted as a spare: its slot stays reserved (``SandboxPool.spare_take``) until
        the caller adds it to the pool, returns it, or releases the slot. A spare still
        starting is waited for (it is ready sooner than a new process would be); one that
        fails is killed and the next one tried."""
        while True:
            spare = self.pool.spare_take()
            if spare is None:
                return None
            self.wake()
            try:
                spare.wait_ready(ready_timeout())
            except SandboxError as exc:
                logger.warning("spare %s could not be used: %s", spare.sandbox_id, exc)
            else:
                if spare.alive() and not spare.stopping:
                    return spare
            spare.kill()
            self.pool.release()

    def retire_one(self) -> bool:
        """Stop the newest spare to make room for a conversation's sandbox (call under
        ``pool.capacity``). Returns whether there was one."""
        spares = self.pool.spares()
        if not spares or not self.pool.spare_discard(spares[-1]):
            return False
        logger.info("spare %s retired to make room", spares[-1].sandbox_id)
        metrics.sandbox_spare(node=self.node, event="retired")
        spares[-1].stop(grace=1.0)
        return True

    # --- the refill thread --------------------------------------------------------------

    def _refill(self) -> None:
        failures = 0
        while not self._halted.is_set():
            spare = self._reserve()
            if spare is None:
                self._wanted.wait(REFILL_CHECK_SECONDS)
                self._wanted.clear()
                continue
            if self._start(spare):
                failures = 0
            else:
                failures += 1
                self._halted.wait(RETRY_DELAYS[min(failures, len(RETRY_DELAYS)) - 1])

    def _reserve(self) -> SandboxProcess | None:
        """A new spare, counted in the pool, when one is wanted and fits; else ``None``."""
        with self.pool.capacity:
            if (
                self._halted.is_set()
                or len(self.pool.spares()) >= self.size
                or self.pool.occupied() >= settings.PAW_MAX_SANDBOXES_PER_NODE
            ):
                return None
            sandbox_id = uuid.uuid4()
            folder = self.folder / sandbox_id.hex
            folder.mkdir(mode=0o700, parents=True)
            spare = SandboxProcess(
                sandbox_id=sandbox_id,
                spec=SandboxSpec(
                    conversation_id=str(sandbox_id), workspace=folder, provider="", model=""
                ),
                sink=self._sink,
                reader=self.reader,
                spare=True,
            )
            self.pool.spare_add(spare)
            return spare

    def _start(self, spare: SandboxProcess) -> bool:
        """Start ``spare`` and wait for its ``ready``; whether it did not fail (a spare
        stopped meanwhile, the node stopping, is no failure)."""
        started = time.monotonic()
        try:
            spare.start()
            if spare.process is None:  # stopped before it started
                self.pool.spare_discard(spare)
                return True
            spare.wait_ready(ready_timeout())
            if "handover" not in spare.capabilities:
                raise SandboxError("the runtime offers no hand-over (an older paw-agent?)")
        except (SandboxError, OSError, RuntimeError) as exc:
            spare.kill()
            self.pool.spare_discard(spare)
            shutil.rmtree(spare.started_in, ignore_errors=True)
            if spare.stopping and self._halted.is_set():
                return True
            metrics.sandbox_spare(node=self.node, event="failed")
            logger.warning("a spare runtime could not be started: %s", exc)
            return False
        metrics.sandbox_spare(node=self.node, event="started")
        logger.info(
            "spare %s ready in %.0f ms (pid %s)",
            spare.sandbox_id,
            (time.monotonic() - started) * 1000,
            spare.pid,
        )
        return True

    def _sink(
        self, spare: SandboxProcess, entries: list | None, returncode: int | None = None
    ) -> None:
        """What a spare's reader hands over before its hand-over: lines (a spare writes
        none but ``ready``: logged, dropped) or its exit (``entries`` None): forgotten,
        its folder removed (a handed-over spare's lines never come here), replaced."""
        if entries is not None:
            for entry in entries:
                logger.warning("spare %s wrote %r", spare.sandbox_id, entry.line)
            return
        was_spare = self.pool.spare_discard(spare)
        shutil.rmtree(spare.started_in, ignore_errors=True)
        if was_spare and not spare.stopping:
            metrics.sandbox_spare(node=self.node, event="died")
            logger.warning(
                "spare %s exited (code %s): %s", spare.sandbox_id, returncode, spare.stderr_tail()
            )
        self.wake()
