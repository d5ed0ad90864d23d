"""Celery edges of the node: each task parses its ids and calls the node-side service it is
named after (:mod:`sandboxes.services`). The web side enqueues them with
:mod:`sandboxes.enqueue` (which routes ``run_execute`` to the node owning the conversation's
sandbox or to the shared ``runs`` queue, and the op tasks to the owning node's queue). All
are idempotent, so a redelivered message does no harm.
"""

from __future__ import annotations

from uuid import UUID

from celery import shared_task

from sandboxes import enqueue, services


@shared_task(name=enqueue.TASK_RUN_EXECUTE, acks_late=True)
def run_execute(run_id: str) -> None:
    """Start the run in this node's sandbox for its conversation."""
    services.run_execute(run_id=UUID(run_id))


@shared_task(name=enqueue.TASK_RUN_CANCEL_DELIVER, acks_late=True)
def run_cancel_deliver(run_id: str) -> None:
    """Write ``cancel`` to the sandbox running the run."""
    services.run_cancel_deliver(run_id=UUID(run_id))


@shared_task(name=enqueue.TASK_APPROVAL_ANSWER_DELIVER, acks_late=True)
def approval_answer_deliver(approval_id: str) -> None:
    """Write the ``answer`` op of a decided approval."""
    services.approval_answer_deliver(approval_id=UUID(approval_id))


@shared_task(name=enqueue.TASK_SANDBOX_STOP_DELIVER, acks_late=True)
def sandbox_stop_deliver(conversation_id: str) -> None:
    """Shut a conversation's sandbox down on this node."""
    services.sandbox_stop_deliver(conversation_id=UUID(conversation_id))


@shared_task(name=enqueue.TASK_NODES_REAP)
def nodes_reap() -> dict[str, int]:
    """Beat: close what lost nodes left behind; re-send runs whose task was lost."""
    return services.nodes_reap()
