"""The web side of the broker: enqueue the node's work as Celery tasks.

This is the only module of ``sandboxes`` that the domain (``conversations``) imports: it
routes each task to the node that owns the conversation's sandbox and imports nothing of
the node side. Tasks are sent by name (``TASK_*``, the names ``sandboxes.tasks`` registers
them under), so the web process never loads the node's code. Call the enqueuers after
commit (``transaction.on_commit``): a worker must find what the task names.

Each ``<op>_enqueue`` sends the task named after the node-side service it calls
(``sandboxes.services``): ``run_execute``, ``run_cancel_deliver``,
``approval_answer_deliver``, ``sandbox_stop_deliver``.
"""

from __future__ import annotations

import uuid

from celery import current_app
from django.db import transaction

from sandboxes.selectors import live_sandbox_nodes, owner_node

#: The shared queue every node consumes: runs of conversations without a live sandbox.
RUNS_QUEUE = "runs"

TASK_RUN_EXECUTE = "sandboxes.tasks.run_execute"
TASK_RUN_CANCEL_DELIVER = "sandboxes.tasks.run_cancel_deliver"
TASK_APPROVAL_ANSWER_DELIVER = "sandboxes.tasks.approval_answer_deliver"
TASK_SANDBOX_STOP_DELIVER = "sandboxes.tasks.sandbox_stop_deliver"
TASK_NODES_REAP = "sandboxes.tasks.nodes_reap"


def node_queue(node: str) -> str:
    """The Celery queue only ``node`` consumes: ``sandbox.<node>``."""
    return f"sandbox.{node}"


def node_queues(node: str) -> list[str]:
    """The queues a worker node consumes: the shared ``runs`` queue and its own."""
    return [RUNS_QUEUE, node_queue(node)]


def _send(task: str, args: list[str], queue: str) -> None:
    current_app.send_task(task, args=args, queue=queue)


def run_execute_enqueue(*, run_id: uuid.UUID, conversation_id: uuid.UUID) -> None:
    """Send a queued run to the node that owns its conversation's live sandbox (so the
    agent keeps its memory), else to the shared ``runs`` queue."""
    node = owner_node(conversation_id)
    _send(TASK_RUN_EXECUTE, [str(run_id)], node_queue(node) if node else RUNS_QUEUE)


def run_cancel_enqueue(*, run_id: uuid.UUID, node: str) -> None:
    """Send a cancel to ``node``, the node running the run (``Run.node``)."""
    _send(TASK_RUN_CANCEL_DELIVER, [str(run_id)], node_queue(node))


def approval_answer_enqueue(*, approval_id: uuid.UUID, node: str) -> None:
    """Send a decided approval to ``node``, the node running its run, which writes the
    ``answer`` op."""
    _send(TASK_APPROVAL_ANSWER_DELIVER, [str(approval_id)], node_queue(node))


def sandbox_stop_enqueue(*, conversation_id: uuid.UUID, node: str | None = None) -> None:
    """Ask the node owning the conversation's live sandbox to shut it down (and to remove
    the workspace if the conversation is gone by then). No-op when no live sandbox
    exists. With ``node``, that node is asked whatever the rows say (one whose row was
    closed as stale: the live row then names another node, which must be left be)."""
    for owner in {node} if node else live_sandbox_nodes(conversation_id):
        _send(TASK_SANDBOX_STOP_DELIVER, [str(conversation_id)], node_queue(owner))


def sandbox_stop_on_commit(*, conversation_id: uuid.UUID) -> None:
    """Inside a transaction that deletes the conversation: read the nodes owning its live
    sandboxes now (the rows naming them go with it) and ask each to shut its sandbox down
    once the transaction commits (nothing is asked if it rolls back). Sent before the
    commit, a node could stop the process and record its end while the delete held the
    conversation's rows, and the two transactions deadlocked."""
    for owner in live_sandbox_nodes(conversation_id):
        transaction.on_commit(
            lambda owner=owner: sandbox_stop_enqueue(conversation_id=conversation_id, node=owner)
        )
