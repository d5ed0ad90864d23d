"""The sandbox pool: the runtime processes a worker node owns, one per conversation, and its
spares (:class:`SandboxPool`, a module-level singleton: :func:`get_pool`).

Only bookkeeping: which process is whose, and how much room is left. The processes
themselves are :mod:`sandboxes.process`'s.
"""

from __future__ import annotations

import collections
import threading
import uuid
from typing import TYPE_CHECKING

from django.conf import settings

if TYPE_CHECKING:
    from sandboxes.process import SandboxProcess


class SandboxPool:
    """The live sandboxes of this node, by conversation id, and its spares.

    Room: ``occupied()`` counts every runtime process the node has or is about to have —
    the conversations' sandboxes, the spares (starting or ready) and the slots reserved
    for a sandbox being spawned or handed over — which ``PAW_MAX_SANDBOXES_PER_NODE``
    bounds. Decisions about room are taken under ``capacity`` (one at a time per node).
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._sandboxes: dict[uuid.UUID, SandboxProcess] = {}
        self._spares: list[SandboxProcess] = []
        self._reserved = 0
        #: Held while deciding whether one more process fits (``sandboxes.services``).
        self.capacity = threading.Lock()
        # One spawn at a time per conversation.
        self._conversation_locks: dict[uuid.UUID, threading.Lock] = collections.defaultdict(
            threading.Lock
        )

    def conversation_lock(self, conversation_id: uuid.UUID) -> threading.Lock:
        with self._lock:
            return self._conversation_locks[conversation_id]

    def get(self, conversation_id: uuid.UUID) -> SandboxProcess | None:
        with self._lock:
            sandbox = self._sandboxes.get(conversation_id)
        return sandbox if sandbox is not None and sandbox.alive() and not sandbox.stopping else None

    def add(self, sandbox: SandboxProcess, *, reserved: bool = False) -> None:
        """Count ``sandbox`` as its conversation's; ``reserved``: it takes the slot
        :meth:`reserve` (or :meth:`spare_take`) held for it."""
        with self._lock:
            self._sandboxes[sandbox.conversation_id] = sandbox
            if reserved:
                self._reserved -= 1

    def discard(self, sandbox: SandboxProcess) -> None:
        with self._lock:
            if self._sandboxes.get(sandbox.conversation_id) is sandbox:
                del self._sandboxes[sandbox.conversation_id]

    def all(self) -> list[SandboxProcess]:
        """The conversations' sandboxes (not the spares)."""
        with self._lock:
            return list(self._sandboxes.values())

    def idle_lru(self) -> list[SandboxProcess]:
        """Idle sandboxes (no run), least recently active first."""
        return sorted(
            (s for s in self.all() if s.active is None and not s.stopping),
            key=lambda s: s.last_active,
        )

    def __len__(self) -> int:
        with self._lock:
            return len(self._sandboxes)

    # --- room ---------------------------------------------------------------------------

    def occupied(self) -> int:
        """Runtime processes this node has or holds a slot for: conversations' sandboxes,
        spares, reserved slots."""
        with self._lock:
            return len(self._sandboxes) + len(self._spares) + self._reserved

    def reserve(self) -> None:
        """Hold a slot for a sandbox about to be spawned (``add(..., reserved=True)`` or
        :meth:`release` gives it back). Call under ``capacity``, after checking room."""
        with self._lock:
            self._reserved += 1

    def release(self) -> None:
        """Give back a slot held by :meth:`reserve` or :meth:`spare_take` (nothing came
        of it)."""
        with self._lock:
            self._reserved -= 1

    # --- spares -------------------------------------------------------------------------

    def spares(self) -> list[SandboxProcess]:
        """The spares, starting or ready, oldest first."""
        with self._lock:
            return list(self._spares)

    def spare_add(self, spare: SandboxProcess) -> None:
        """Count a new spare (call under ``capacity``, after checking room)."""
        with self._lock:
            self._spares.append(spare)

    def spare_take(self) -> SandboxProcess | None:
        """The oldest spare (the likeliest to be ready), no longer a spare: its slot is
        held as reserved until ``add(..., reserved=True)``, :meth:`spare_return` or
        :meth:`release`. ``None`` when there is none."""
        with self._lock:
            if not self._spares:
                return None
            self._reserved += 1
            return self._spares.pop(0)

    def spare_return(self, spare: SandboxProcess) -> None:
        """Put back a spare :meth:`spare_take` gave, untouched (it was not handed over)."""
        with self._lock:
            self._spares.insert(0, spare)
            self._reserved -= 1

    def spare_discard(self, spare: SandboxProcess) -> bool:
        """Forget a spare (it exited, or is retired); whether it was one."""
        with self._lock:
            if spare in self._spares:
                self._spares.remove(spare)
                return True
            return False

    def state_counts(self) -> dict[str, int]:
        """How many live sandboxes are in each state: ``starting`` (not ready yet),
        ``idle``, ``busy`` (a run), ``stopping``, and ``spare`` (waiting for a new
        conversation, starting or ready)."""
        counts = dict.fromkeys(("starting", "idle", "busy", "stopping"), 0)
        for sandbox in self.all():
            counts[sandbox.state] += 1
        counts["spare"] = len(self.spares())
        return counts


_pool: SandboxPool | None = None
_pool_lock = threading.Lock()


def get_pool() -> SandboxPool:
    """This process's sandbox pool."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = SandboxPool()
        return _pool


def ready_timeout() -> float:
    """``PAW_SANDBOX_READY_TIMEOUT`` in seconds."""
    return float(settings.PAW_SANDBOX_READY_TIMEOUT)
