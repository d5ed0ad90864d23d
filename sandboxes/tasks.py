"""Celery edges of the sandboxes: each task parses its ids and calls one service.

``run_execute`` goes to the node owning the conversation's sandbox (queue
``sandbox.<node>``) or to the shared ``runs`` queue; the op tasks go to the owning
node's queue. All are idempotent, so a redelivered message does no harm.
"""

from __future__ import annotations

from uuid import UUID

from celery import shared_task


@shared_task(acks_late=True)
def run_execute(run_id: str) -> None:
    """Start the run in this node's sandbox for its conversation (idempotent)."""
    from sandboxes.services import run_dispatch

    run_dispatch(run_id=UUID(run_id))


@shared_task(acks_late=True)
def run_cancel_op(run_id: str) -> None:
    """Write ``cancel`` to the sandbox running the run."""
    from sandboxes.services import run_cancel_deliver

    run_cancel_deliver(run_id=UUID(run_id))


@shared_task(acks_late=True)
def approval_answer(approval_id: str) -> None:
    """Write the ``answer`` op of a decided approval."""
    from sandboxes.services import approval_answer_deliver

    approval_answer_deliver(approval_id=UUID(approval_id))


@shared_task(acks_late=True)
def sandbox_stop(conversation_id: str) -> None:
    """Shut a conversation's sandbox down on this node."""
    from sandboxes.services import sandbox_stop_local

    sandbox_stop_local(conversation_id=UUID(conversation_id))


@shared_task
def nodes_reap() -> dict[str, int]:
    """Beat: close what lost nodes left behind; re-send runs whose task was lost."""
    from sandboxes.services import nodes_reap as reap

    return reap()
