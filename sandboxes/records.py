"""The node's records: every write of a ``Sandbox`` or ``WorkerNode`` row, one named
service each (a test holds that no other module writes them:
``tests/sandboxes/test_records.py``).

Called by the node (:mod:`sandboxes.node`: its start, stop, heartbeat), its event pipeline
(:mod:`sandboxes.pipeline`: busy, idle, exit), the node's services
(:mod:`sandboxes.services`: a sandbox's row, ready or dead) and the reaper. Times are the
database's ``timezone.now()``; ids are the ``Sandbox`` rows' UUIDs. Each returns at once;
none raises but the database's errors.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any

from django.db import transaction
from django.utils import timezone

from sandboxes.enqueue import sandbox_stop_enqueue
from sandboxes.models import Sandbox, WorkerNode

# --- worker nodes -----------------------------------------------------------------------


def node_register(*, name: str, network: str) -> None:
    """Record that node ``name`` (re)started now, its sandboxes on ``network``
    (``isolated``, ``host``, or ``""`` when it cannot start sandboxes): started, alive,
    not stopped."""
    now = timezone.now()
    WorkerNode.objects.update_or_create(
        name=name,
        defaults={
            "started_at": now,
            "heartbeat_at": now,
            "stopped_at": None,
            "sandbox_network": network,
        },
    )


def node_heartbeat(*, name: str, sandbox_ids: Iterable[uuid.UUID]) -> None:
    """The heartbeat of node ``name`` and of its live sandboxes ``sandbox_ids``, now."""
    now = timezone.now()
    WorkerNode.objects.filter(name=name).update(heartbeat_at=now)
    ids = list(sandbox_ids)
    if ids:
        Sandbox.objects.filter(id__in=ids, state__in=Sandbox.LIVE_STATES).update(heartbeat_at=now)


def node_mark_stopped(*, name: str) -> None:
    """Node ``name`` stopped: it and its live sandboxes' rows say so (``stopped``)."""
    WorkerNode.objects.filter(name=name).update(stopped_at=timezone.now())
    Sandbox.objects.filter(node=name, state__in=Sandbox.LIVE_STATES).update(
        state=Sandbox.State.STOPPED, stopped_at=timezone.now()
    )


def nodes_mark_lost(*, names: list[str]) -> None:
    """The nodes ``names`` stopped answering: they count as stopped from now."""
    WorkerNode.objects.filter(name__in=names).update(stopped_at=timezone.now())


def nodes_sandboxes_mark_dead(*, nodes: list[str]) -> int:
    """Every live sandbox row of the nodes ``nodes`` becomes ``dead`` (what a lost or
    restarted node left behind); how many."""
    return Sandbox.objects.filter(node__in=nodes, state__in=Sandbox.LIVE_STATES).update(
        state=Sandbox.State.DEAD, stopped_at=timezone.now()
    )


# --- sandboxes --------------------------------------------------------------------------


def sandbox_create(
    *, conversation_id: uuid.UUID, node: str, provider: str, model: str, **fields: Any
) -> Sandbox:
    """The ``Sandbox`` row of a sandbox of the conversation starting on ``node``
    (``fields``: more of its columns); a live row left by another node (lost, or an
    evicted race) is closed first: one live sandbox per conversation."""
    with transaction.atomic():
        stale = list(
            Sandbox.objects.select_for_update().filter(
                conversation_id=conversation_id, state__in=Sandbox.LIVE_STATES
            )
        )
        for row in stale:
            row.state = Sandbox.State.STOPPED if row.node == node else Sandbox.State.DEAD
            row.stopped_at = timezone.now()
            row.save(update_fields=["state", "stopped_at"])
            if row.node != node:
                # Only that node: the live row is ours now, and our new sandbox must stay.
                transaction.on_commit(
                    lambda stale_node=row.node: sandbox_stop_enqueue(
                        conversation_id=conversation_id, node=stale_node
                    )
                )
        return Sandbox.objects.create(
            conversation_id=conversation_id,
            node=node,
            provider=provider,
            model=model,
            **{"command": "", **fields},
        )


def sandbox_mark_ready(*, sandbox_id: uuid.UUID, **fields: Any) -> None:
    """The sandbox started (or took a hand-over) and waits for a run: ``ready``, active
    now; ``fields``: more of its columns (``pid``, ``command``, ``capabilities``)."""
    Sandbox.objects.filter(id=sandbox_id).update(
        state=Sandbox.State.READY, last_active_at=timezone.now(), **fields
    )


def sandbox_mark_dead(*, sandbox_id: uuid.UUID, stderr_tail: str) -> None:
    """The sandbox failed to start or to take its hand-over: ``dead``, with the last
    8000 characters of its (masked) ``stderr_tail``."""
    Sandbox.objects.filter(id=sandbox_id).update(
        state=Sandbox.State.DEAD, stopped_at=timezone.now(), stderr_tail=stderr_tail[-8000:]
    )


def sandboxes_mark_busy(*, sandbox_ids: set[uuid.UUID]) -> None:
    """A run started in each of the ``ready`` sandboxes ``sandbox_ids``: ``busy``."""
    Sandbox.objects.filter(id__in=sandbox_ids, state=Sandbox.State.READY).update(
        state=Sandbox.State.BUSY, last_active_at=timezone.now()
    )


def sandboxes_mark_idle(*, sandbox_ids: set[uuid.UUID]) -> None:
    """The run of each of the ``busy`` sandboxes ``sandbox_ids`` ended: ``ready`` again."""
    Sandbox.objects.filter(id__in=sandbox_ids, state=Sandbox.State.BUSY).update(
        state=Sandbox.State.READY, last_active_at=timezone.now()
    )


def sandbox_mark_exited(
    *, sandbox_id: uuid.UUID, stopped: bool, exit_code: int | None, stderr_tail: str
) -> None:
    """The sandbox's process exited with ``exit_code``: ``stopped`` (PAW stopped it) or
    ``dead``, if its row was still live; its code and the last 8000 characters of its
    (masked) ``stderr_tail`` are kept either way."""
    state = Sandbox.State.STOPPED if stopped else Sandbox.State.DEAD
    Sandbox.objects.filter(id=sandbox_id, state__in=Sandbox.LIVE_STATES).update(
        state=state, stopped_at=timezone.now()
    )
    Sandbox.objects.filter(id=sandbox_id).update(
        exit_code=exit_code, stderr_tail=stderr_tail[-8000:]
    )
