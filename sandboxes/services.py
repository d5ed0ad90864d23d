"""Sandbox services: routing runs and ops to the node that owns a conversation's sandbox,
and what that node does with them.

Web-side functions (``run_plan``, ``run_enqueue``, ``run_cancel_dispatch``,
``approval_answer_dispatch``, ``sandbox_stop_for_conversation``) only write rows and
enqueue Celery tasks. Node-side functions (``run_dispatch``, ``run_cancel_deliver``,
``approval_answer_deliver``, ``sandbox_stop_local``) run in the worker that owns the
sandbox; they spawn, submit and write ops, and return without waiting for the run.
"""

from __future__ import annotations

import logging
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from conversations.models import Approval, Conversation, Run
from conversations.services import events as event_services
from conversations.services import runs as run_services
from conversations.workspaces import workspace_ensure, workspace_path
from paw_project.errors import DomainError
from sandboxes.launch import SandboxSpec
from sandboxes.models import Sandbox, WorkerNode
from sandboxes.node import Node, current_node, deliver_answer
from sandboxes.pool import SandboxError, SandboxProcess, ready_timeout
from secrets_vault.services import datasources_validate, provider_resolve, sandbox_environment

logger = logging.getLogger(__name__)

# --- planning and routing (web side) ----------------------------------------------------------


@dataclass(frozen=True)
class RunPlan:
    """The validated choices a run is created with."""

    provider: str
    model: str
    datasources: list[str]


def run_plan(
    *, user: Any, conversation: Conversation, llm_provider: str | None, llm_model: str | None,
    datasources: list[str],
) -> RunPlan:  # fmt: skip
    """Validate a run's provider, model and datasources before it is created (provider
    precedence and activation: ``secrets_vault.services.provider_resolve``).

    Raises :class:`InvalidRequest` with the reason: ``no_provider``, ``unknown_provider``,
    ``provider_inactive``, ``unknown_model``, ``unknown_datasource``.
    """
    choice = provider_resolve(
        user=user, conversation=conversation, llm_provider=llm_provider, llm_model=llm_model
    )
    slugs = datasources_validate(slugs=datasources)
    return RunPlan(provider=choice.name, model=choice.model, datasources=slugs)


def sandbox_spec_for(run: Run) -> SandboxSpec:
    """What the run's sandbox must be started with: the provider's endpoint, key and
    model, the user's secrets and the datasources the run may use, and the secret values
    among them (for masking). Keys are looked up here, on the worker, at dispatch time:
    they never travel through the broker. Raises :class:`InvalidRequest` when the run's
    provider or datasources are no longer usable (key deleted, datasource disabled)."""
    choice = provider_resolve(
        user=run.user, conversation=run.conversation, llm_provider=run.provider, llm_model=run.model
    )
    environment = sandbox_environment(
        user=run.user, datasource_slugs=run.datasources, provider=choice
    )
    return SandboxSpec(
        conversation_id=str(run.conversation_id),
        workspace=workspace_ensure(run.conversation_id),
        provider=choice.name,
        model=choice.model,
        env=environment.env,
        secret_values=environment.secret_values,
    )


def node_is_alive(name: str) -> bool:
    """Whether the worker node ``name`` has a recent heartbeat and has not stopped."""
    cutoff = timezone.now() - timedelta(seconds=settings.PAW_NODE_DEAD_SECONDS)
    return WorkerNode.objects.filter(
        name=name, heartbeat_at__gte=cutoff, stopped_at__isnull=True
    ).exists()


def owner_node(conversation_id: uuid.UUID) -> str | None:
    """The live node whose sandbox holds the conversation, if any."""
    node = (
        Sandbox.objects.filter(conversation_id=conversation_id, state__in=Sandbox.LIVE_STATES)
        .values_list("node", flat=True)
        .first()
    )
    return node if node and node_is_alive(node) else None


def node_queue(node: str) -> str:
    """The Celery queue only ``node`` consumes."""
    return f"sandbox.{node}"


def run_enqueue(*, run_id: uuid.UUID) -> None:
    """Hand a queued run to the node that owns its conversation's live sandbox (so the
    agent keeps its memory), else to the shared ``runs`` queue."""
    from sandboxes.tasks import run_execute

    conversation_id = (
        Run.objects.filter(id=run_id).values_list("conversation_id", flat=True).first()
    )
    if conversation_id is None:
        return
    node = owner_node(conversation_id)
    run_execute.apply_async(args=[str(run_id)], queue=node_queue(node) if node else "runs")


def run_cancel_dispatch(*, run_id: uuid.UUID) -> None:
    """Route a cancel to the node running the run (or end the run here if none has it)."""
    from sandboxes.tasks import run_cancel_op

    node = Run.objects.filter(id=run_id).values_list("node", flat=True).first()
    if node:
        run_cancel_op.apply_async(args=[str(run_id)], queue=node_queue(node))


def approval_answer_dispatch(*, approval_id: uuid.UUID) -> None:
    """Route a decided approval to the node running its run, which writes the answer."""
    from sandboxes.tasks import approval_answer

    node = Approval.objects.filter(id=approval_id).values_list("run__node", flat=True).first()
    if node:
        approval_answer.apply_async(args=[str(approval_id)], queue=node_queue(node))


def sandbox_stop_for_conversation(*, conversation_id: uuid.UUID, node: str | None = None) -> None:
    """Ask the node owning the conversation's sandbox to shut it down (and to remove the
    workspace if the conversation is gone). No-op when no live sandbox exists. With
    ``node``, that node is asked whatever the rows say (one whose row was closed as stale:
    the owner of the conversation's live row is then another node, which must be left be)."""
    from sandboxes.tasks import sandbox_stop

    nodes = {node} if node else _live_sandbox_nodes(conversation_id)
    for owner in nodes:
        sandbox_stop.apply_async(args=[str(conversation_id)], queue=node_queue(owner))


def _live_sandbox_nodes(conversation_id: uuid.UUID) -> set[str]:
    """The nodes holding a live sandbox row of the conversation."""
    return set(
        Sandbox.objects.filter(
            conversation_id=conversation_id, state__in=Sandbox.LIVE_STATES
        ).values_list("node", flat=True)
    )


# --- on the owning node -------------------------------------------------------------------


def run_dispatch(*, run_id: uuid.UUID) -> None:
    """Claim a queued run on this node, make sure its sandbox is up, and submit it.

    Idempotent: a run that is no longer queued is left alone. Failures end the run
    ``error`` with a code (``sandbox_start``, ``capacity``, ``sandbox``…) and a message.
    Returns once the runtime acknowledged the run; the run itself goes on in the sandbox.
    """
    node = current_node()
    run = run_services.run_claim(run_id=run_id, node=node.name)
    if run is None:
        return
    try:
        spec = sandbox_spec_for(run)
        with node.pool.conversation_lock(run.conversation_id):
            sandbox = _sandbox_for(node, run, spec)
            sandbox.submit(run_id=run.id, prompt=run.prompt)
            # A cancel that arrived after the claim: its op found no run in the sandbox yet.
            if Run.objects.filter(id=run.id, cancel_requested=True).exists():
                sandbox.send("cancel", run_id=str(run.id))
    except SandboxError as exc:
        run_services.run_fail(run_id=run.id, code=exc.code, message=str(exc))
    except DomainError as exc:  # the provider or a datasource became unusable meanwhile
        run_services.run_fail(run_id=run.id, code=exc.code, message=exc.detail)
    except Exception as exc:
        logger.exception("run %s: dispatch failed", run.id)
        run_services.run_fail(
            run_id=run.id,
            code="internal",
            message=f"PAW could not start the run ({exc.__class__.__name__}).",
        )


def _sandbox_for(node: Node, run: Run, spec: SandboxSpec) -> SandboxProcess:
    """The conversation's live sandbox on this node, replaced when the run needs another
    provider, model or environment; spawned when there is none."""
    sandbox = node.pool.get(run.conversation_id)
    if sandbox is not None and sandbox.current_run is not None:
        raise SandboxError("the agent is still busy with the previous run", code="sandbox_busy")
    if sandbox is not None and sandbox.fingerprint != spec.fingerprint:
        logger.info(
            "sandbox %s: provider/model/environment changed; restarting it", sandbox.sandbox_id
        )
        sandbox.stop()
        node.pool.discard(sandbox)
        sandbox = None
    if sandbox is None:
        sandbox = sandbox_spawn(node, spec, exclude_run=run.id)
    return sandbox


def _make_room(node: Node) -> None:
    """Evict least recently used idle sandboxes until one more fits on this node."""
    while len(node.pool) >= settings.PAW_MAX_SANDBOXES_PER_NODE:
        idle = node.pool.idle_lru()
        if not idle:
            raise SandboxError(
                f"this node already runs {settings.PAW_MAX_SANDBOXES_PER_NODE} busy sandboxes; try again shortly",
                code="capacity",
            )
        victim = idle[0]
        logger.info("evicting idle sandbox %s (least recently used)", victim.sandbox_id)
        victim.stop()
        node.pool.discard(victim)


def sandbox_spawn(
    node: Node, spec: SandboxSpec, *, exclude_run: uuid.UUID | None = None
) -> SandboxProcess:
    """Start a runtime process for ``spec`` on this node and wait for its ``ready``; seed
    it with the conversation's earlier turns (capability ``history``) or store a notice
    that it starts without them. Raises :class:`SandboxError` (``sandbox_start``,
    ``capacity``)."""
    _make_room(node)
    conversation_id = uuid.UUID(spec.conversation_id)
    with transaction.atomic():
        # A live row left by another node (lost, or an evicted race) is closed: one live
        # sandbox per conversation.
        stale = list(
            Sandbox.objects.select_for_update().filter(
                conversation_id=conversation_id, state__in=Sandbox.LIVE_STATES
            )
        )
        for row in stale:
            row.state = Sandbox.State.STOPPED if row.node == node.name else Sandbox.State.DEAD
            row.stopped_at = timezone.now()
            row.save(update_fields=["state", "stopped_at"])
            if row.node != node.name:
                # Only that node: the live row is ours now, and our new sandbox must stay.
                transaction.on_commit(
                    lambda stale_node=row.node: sandbox_stop_for_conversation(
                        conversation_id=conversation_id, node=stale_node
                    )
                )
        row = Sandbox.objects.create(
            conversation_id=conversation_id,
            node=node.name,
            command="",
            provider=spec.provider,
            model=spec.model,
        )
    sandbox = SandboxProcess(sandbox_id=row.id, spec=spec, sink=node.pipeline.submit)
    try:
        sandbox.start()
        node.pool.add(sandbox)
        started = time.monotonic()
        sandbox.wait_ready(ready_timeout())
    except (SandboxError, OSError, RuntimeError) as exc:
        sandbox.kill()
        node.pool.discard(sandbox)
        Sandbox.objects.filter(id=row.id).update(
            state=Sandbox.State.DEAD,
            stopped_at=timezone.now(),
            stderr_tail=sandbox.stderr_tail()[-8000:],
        )
        if isinstance(exc, SandboxError):
            raise
        raise SandboxError(
            f"the agent runtime could not be started: {exc}", code="sandbox_start"
        ) from exc
    Sandbox.objects.filter(id=row.id).update(
        pid=sandbox.pid,
        state=Sandbox.State.READY,
        command=" ".join(sandbox.command)[:1000],
        capabilities=sorted(sandbox.capabilities),
        last_active_at=timezone.now(),
    )
    logger.info(
        "sandbox %s ready in %.0f ms (pid %s)",
        row.id,
        (time.monotonic() - started) * 1000,
        sandbox.pid,
    )
    _seed_history(sandbox, exclude_run=exclude_run)
    return sandbox


def conversation_turns(
    *, conversation_id: uuid.UUID, exclude_run: uuid.UUID | None = None
) -> list[dict[str, str]]:
    """The conversation's last ``PAW_HISTORY_TURNS`` finished turns since its memory was
    last reset, oldest first: ``[{"prompt": str, "answer": str}]``."""
    conversation = Conversation.objects.only("memory_since").get(id=conversation_id)
    runs = Run.objects.filter(conversation_id=conversation_id, status=Run.Status.DONE).exclude(
        answer=""
    )
    if exclude_run is not None:
        runs = runs.exclude(id=exclude_run)
    if conversation.memory_since is not None:
        runs = runs.filter(created_at__gte=conversation.memory_since)
    turns = list(
        runs.order_by("-created_at").values("prompt", "answer")[: settings.PAW_HISTORY_TURNS]
    )
    return [{"prompt": t["prompt"], "answer": t["answer"]} for t in reversed(turns)]


def _seed_history(sandbox: SandboxProcess, *, exclude_run: uuid.UUID | None) -> None:
    turns = conversation_turns(conversation_id=sandbox.conversation_id, exclude_run=exclude_run)
    if not turns:
        return
    if "history" in sandbox.capabilities:
        sandbox.send("history", turns=turns)
        return
    event_services.notice_append(
        conversation_id=sandbox.conversation_id,
        run_id=exclude_run,
        code="memory_lost",
        message="The agent restarted without its earlier context: its runtime cannot restore the conversation.",
    )


def run_cancel_deliver(*, run_id: uuid.UUID) -> None:
    """On the owning node: write ``cancel`` for a run that is executing here. A run whose
    sandbox is gone is ended ``cancelled`` directly."""
    node = current_node()
    run = Run.objects.filter(id=run_id).first()
    if run is None or not run.is_active:
        return
    sandbox = node.pool.get(run.conversation_id)
    if sandbox is not None and sandbox.current_run == run.id:
        try:
            sandbox.send("cancel", run_id=str(run.id))
            return
        except SandboxError:
            pass
    if run.status == Run.Status.RUNNING or sandbox is None:
        usage = sandbox.run_usage.pop(run.id, None) if sandbox is not None else None
        run_services.run_finish(run_id=run.id, status=Run.Status.CANCELLED, usage=usage)
    # A run still being dispatched sees cancel_requested itself.


def approval_answer_deliver(*, approval_id: uuid.UUID) -> None:
    """On the owning node: write the ``answer`` op for a decided approval."""
    approval = Approval.objects.filter(id=approval_id).first()
    if approval is None or approval.status == Approval.Status.PENDING:
        return
    if not deliver_answer(current_node(), approval):
        logger.info("approval %s: its run is no longer in a sandbox here", approval_id)


def sandbox_stop_local(*, conversation_id: uuid.UUID) -> None:
    """On the owning node: shut the conversation's sandbox down; remove the workspace when
    the conversation no longer exists (deleted while its sandbox ran)."""
    node = current_node()
    with node.pool.conversation_lock(conversation_id):
        sandbox = node.pool.get(conversation_id)
        if sandbox is not None:
            if sandbox.current_run is not None:
                sandbox.forced_outcome[sandbox.current_run] = (
                    "sandbox_stopped",
                    "the sandbox was stopped",
                )
            sandbox.stop()
            node.pool.discard(sandbox)
    if not Conversation.objects.filter(id=conversation_id).exists():
        shutil.rmtree(workspace_path(conversation_id), ignore_errors=True)


# --- reaping (Celery beat) -------------------------------------------------------------------


def nodes_reap() -> dict[str, int]:
    """Close what silent nodes left behind, and re-send runs whose task was lost.

    A node without a heartbeat for ``PAW_NODE_DEAD_SECONDS`` is lost: its live sandboxes
    become ``dead``, its active runs end ``error`` ("worker lost") and their pending
    approvals are cancelled. Runs queued for over a minute are enqueued again (dispatch
    is idempotent), which recovers tasks an in-memory broker lost on a restart.
    Returns counts: ``{"nodes", "sandboxes", "runs", "requeued"}``.
    """
    cutoff = timezone.now() - timedelta(seconds=settings.PAW_NODE_DEAD_SECONDS)
    lost = list(
        WorkerNode.objects.filter(heartbeat_at__lt=cutoff, stopped_at__isnull=True).values_list(
            "name", flat=True
        )
    )
    stopped = list(
        WorkerNode.objects.filter(stopped_at__isnull=False).values_list("name", flat=True)
    )
    gone = lost + stopped
    sandboxes = Sandbox.objects.filter(node__in=gone, state__in=Sandbox.LIVE_STATES).update(
        state=Sandbox.State.DEAD, stopped_at=timezone.now()
    )
    runs = 0
    for run_id in Run.objects.filter(
        node__in=gone, status__in=(Run.Status.STARTING, Run.Status.RUNNING)
    ).values_list("id", flat=True):
        if run_services.run_fail(
            run_id=run_id,
            code="worker_lost",
            message="worker lost: the node running this run stopped answering",
        ):
            runs += 1
    if lost:
        WorkerNode.objects.filter(name__in=lost).update(stopped_at=timezone.now())
    requeued = runs_requeue(older_than_seconds=60)
    return {"nodes": len(lost), "sandboxes": sandboxes, "runs": runs, "requeued": requeued}


def runs_requeue(*, older_than_seconds: float) -> int:
    """Enqueue again every run still ``queued`` after ``older_than_seconds`` (its task may
    be lost: dispatch is idempotent, so a duplicate does no harm). Returns how many.

    The reaper uses a minute; an embedded PAW starting up uses 0, because its in-memory
    broker lost every task of the process before it."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    run_ids = list(
        Run.objects.filter(status=Run.Status.QUEUED, created_at__lte=cutoff).values_list(
            "id", flat=True
        )
    )
    for run_id in run_ids:
        run_enqueue(run_id=run_id)
    return len(run_ids)
