"""The node side: what a worker node does with the work the web side enqueued
(:mod:`sandboxes.enqueue`), called by the Celery tasks named after each function
(:mod:`sandboxes.tasks`): execute a run (spawn or reuse the conversation's sandbox, submit),
deliver a cancel, an approval's answer or a stop to a sandbox of this node, and — from
Celery beat — reap what lost nodes left behind. They return without waiting for the run:
the run goes on in the sandbox, and its lines come back through the node's event pipeline.
"""

from __future__ import annotations

import logging
import sqlite3
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import connection
from django.utils import timezone

from conversations.selectors import events as event_selectors
from conversations.selectors import runs as run_selectors
from conversations.selectors.conversations import approval_timeout_of
from conversations.services import events as event_services
from conversations.services import lineage as lineage_services
from conversations.services import runs as run_services
from conversations.services.workspaces import workspace_adopt, workspace_ensure, workspace_remove
from paw_project import metrics
from paw_project.errors import DomainError
from sandboxes import records
from sandboxes.enqueue import run_execute_enqueue
from sandboxes.host_folder import knowledge_indexes_place
from sandboxes.launch import (
    SandboxSpec,
    isolation_mode,
    memory_exchanges,
    network_mode,
    runtime_argv,
    sqlite_datasource_binds,
)
from sandboxes.models import Sandbox
from sandboxes.network import SPARE_FORWARD_PORTS, network_plan
from sandboxes.node import Node, current_node
from sandboxes.pool import ready_timeout
from sandboxes.process import SandboxProcess
from sandboxes.protocol import HostNotice, runtime_gated
from sandboxes.run import SandboxError
from sandboxes.selectors import lost_node_names, stopped_node_names
from secrets_vault.services import (
    knowledge_for_run,
    provider_resolve,
    sandbox_environment,
)

logger = logging.getLogger(__name__)


def sandbox_spec_for(run: Any) -> SandboxSpec:
    """What the sandbox of ``run`` (a ``conversations`` run as
    :func:`~conversations.services.runs.run_claim` returns it, with its user and
    conversation) must be started with: the provider's endpoint, key and
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
        datasources=environment.datasources,
        answer_timeout=approval_timeout_of(run.conversation),
        vision=choice.vision,
    )


def run_submit_options(
    run: Any, sandbox: SandboxProcess, *, vision: bool = False
) -> dict[str, Any]:
    """What the submit of ``run`` carries beside its prompt, as far as the sandbox's
    runtime takes it (``ready.capabilities``): ``tools``, the only ones the run may use
    (capability ``submit_tools``), ``knowledge`` of its datasources (capability
    ``knowledge``: the entries chosen for the prompt and the index files written for its
    ``search_knowledge`` tool into the sandbox's read-only ``.paw/host``), and, for a
    runtime with capability ``images``, ``vision`` (whether the model accepts images) and
    the run's ``attachments`` (``[{"path"}]``). Raises :class:`SandboxError`
    ``runtime_unsupported`` for a restricted run on a runtime that cannot restrict its
    tools (PAW would stop it at its first other tool anyway) or a run with attachments on
    a runtime that cannot send images, and ``model_without_vision`` for attachments when
    the model no longer accepts images (its provider changed since the run was
    accepted). A knowledge index that cannot be written (disk full) leaves the run
    without knowledge (logged), not without an answer."""
    options: dict[str, Any] = {}
    attachments = list(getattr(run, "attachments", None) or [])
    if attachments:
        if "images" not in sandbox.capabilities:
            raise SandboxError(
                "this message has images attached (" + ", ".join(attachments) + "), and the "
                "agent runtime cannot send images to the model: use paw-agent "
                "(PAW_HARNESS_CMD)",
                code="runtime_unsupported",
            )
        if not vision:
            raise SandboxError(
                f"the model '{run.model}' does not accept images, so the attached "
                + ", ".join(attachments)
                + " cannot be sent to it",
                code="model_without_vision",
            )
        options["attachments"] = [{"path": path} for path in attachments]
    if "images" in sandbox.capabilities:
        options["vision"] = bool(vision)
    if run.tools:
        if "submit_tools" not in sandbox.capabilities:
            raise SandboxError(
                "this run may use only some tools (" + ", ".join(run.tools) + "), and the "
                "agent runtime cannot be told so: use paw-agent (PAW_HARNESS_CMD)",
                code="runtime_unsupported",
            )
        options["tools"] = list(run.tools)
    if "knowledge" in sandbox.capabilities:
        # Also for a run without datasources: the index files of earlier runs' go.
        knowledge = knowledge_for_run(
            datasource_slugs=list(run.datasources), prompt=run.prompt, user=run.user
        )
        try:
            indexes = knowledge_indexes_place(sandbox.spec.workspace, knowledge)
        except (OSError, sqlite3.Error):  # an index that cannot be written: run without it
            logger.exception("run %s: its datasources' knowledge could not be prepared", run.id)
        else:
            if knowledge.entries or indexes:
                options["knowledge"] = {"entries": knowledge.entries, "indexes": indexes}
    return options


def run_execute(*, run_id: uuid.UUID) -> None:
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
            options = run_submit_options(run, sandbox, vision=spec.vision)
            # Before the submit: a quick run's result may be stored before it returns.
            lineage_services.run_knowledge_given_record(
                run_id=run.id, entries=options.get("knowledge", {}).get("entries", [])
            )
            sandbox.submit(
                run_id=run.id,
                user_id=run.user_id,
                prompt=run.prompt,
                queued_at=run.created_at.timestamp(),
                **options,
            )
            # A cancel that arrived after the claim: its op found no run in the sandbox yet.
            if run_selectors.run_cancel_requested(run_id=run.id) and sandbox.active is not None:
                sandbox.active.cancel()
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


def _sandbox_for(node: Node, run: Any, spec: SandboxSpec) -> SandboxProcess:
    """The conversation's live sandbox on this node, replaced when the run needs another
    provider, model or environment; spawned when there is none."""
    sandbox = node.pool.get(run.conversation_id)
    if sandbox is not None and sandbox.active is not None:
        raise SandboxError("the agent is still busy with the previous run", code="sandbox_busy")
    if sandbox is not None and sandbox.fingerprint != spec.fingerprint:
        logger.info(
            "sandbox %s: provider/model/environment changed; restarting it", sandbox.sandbox_id
        )
        sandbox.stop()
        node.pool.discard(sandbox)
        sandbox = None
    if sandbox is not None and run.replaces_id is not None:
        sandbox = _memory_reseed(node, sandbox, run_id=run.id)
    if sandbox is None:
        sandbox = sandbox_handover(node, spec, exclude_run=run.id)
    if sandbox is None:
        sandbox = sandbox_spawn(node, spec, exclude_run=run.id)
    return sandbox


def _make_room(node: Node) -> None:
    """Hold a slot (``SandboxPool.reserve``) for one more sandbox on this node, whose
    ``PAW_MAX_SANDBOXES_PER_NODE`` counts the conversations' sandboxes and the spares:
    at the limit a spare is retired first, then the least recently used idle sandbox is
    evicted. Raises :class:`SandboxError` ``capacity`` when every slot is busy."""
    limit = settings.PAW_MAX_SANDBOXES_PER_NODE
    with node.pool.capacity:
        while node.pool.occupied() >= limit:
            if node.spares.retire_one():
                continue
            idle = node.pool.idle_lru()
            if not idle:
                raise SandboxError(
                    f"this node already runs {limit} busy sandboxes; try again shortly",
                    code="capacity",
                )
            victim = idle[0]
            logger.info("evicting idle sandbox %s (least recently used)", victim.sandbox_id)
            metrics.sandbox_evicted(node=node.name)
            victim.stop()
            node.pool.discard(victim)
        node.pool.reserve()


def _sandbox_row_create(node: Node, spec: SandboxSpec, **fields: Any) -> Sandbox:
    """The ``Sandbox`` row of a sandbox of ``spec``'s conversation starting on this node
    (``fields``: more of its columns): :func:`~sandboxes.records.sandbox_create`."""
    return records.sandbox_create(
        conversation_id=uuid.UUID(spec.conversation_id),
        node=node.name,
        provider=spec.provider,
        model=spec.model,
        **fields,
    )


def _sandbox_dead(node: Node, sandbox: SandboxProcess, *, counted: bool) -> None:
    """A sandbox that failed to start or to take its hand-over: killed, its slot given
    back (``counted``: it was already counted as its conversation's, else its slot was
    reserved) and its row ``dead`` with its stderr's tail."""
    sandbox.kill()
    if counted:
        node.pool.discard(sandbox)
    else:
        node.pool.release()
    records.sandbox_mark_dead(sandbox_id=sandbox.sandbox_id, stderr_tail=sandbox.stderr_tail())


def sandbox_handover(
    node: Node, spec: SandboxSpec, *, exclude_run: uuid.UUID | None = None
) -> SandboxProcess | None:
    """Give ``spec``'s conversation one of this node's spares (``sandboxes/spares.py``):
    its folder becomes the conversation's workspace, it gets a ``Sandbox`` row, the run's
    network plan and the run's variables (:meth:`SandboxProcess.hand_over`); then it is
    seeded like a spawned sandbox (:func:`sandbox_spawn`). Returns ``None``, having
    changed nothing, when there is no spare, when the run does not fit one (under
    bubblewrap a SQLite datasource, whose file is bound at the start; more TCP
    destinations than a spare's relay has ports), or when the conversation's workspace
    is not empty (an upload came first): the caller spawns. A spare that fails its
    hand-over is killed (``None`` too)."""
    if not node.spares.size:
        return None
    plan = None
    if network_mode() == "isolated":
        plan = network_plan(spec.env, spec.datasources)
        if len(plan.forwards) > SPARE_FORWARD_PORTS:
            return None
    if isolation_mode() == "bwrap" and sqlite_datasource_binds(spec.env, spec.datasources):
        return None
    started = time.monotonic()
    spare = node.spares.take()
    if spare is None:
        return None
    if not workspace_adopt(spec.conversation_id, spare.started_in):
        node.pool.spare_return(spare)  # untouched: still nobody's
        return None
    row = _sandbox_row_create(
        node,
        spec,
        id=spare.sandbox_id,
        pid=spare.pid,
        command=" ".join(spare.command)[:1000],
        capabilities=sorted(spare.capabilities),
    )
    try:
        spare.hand_over(
            spec, sink=node.pipeline.submit, on_network_refused=network_refusal_notice, plan=plan
        )
    except SandboxError as exc:
        logger.warning("spare %s failed its hand-over: %s", spare.sandbox_id, exc)
        metrics.sandbox_spare(node=node.name, event="failed")
        _sandbox_dead(node, spare, counted=False)
        return None
    node.pool.add(spare, reserved=True)
    metrics.sandbox_spawned(node=node.name, ok=True)
    metrics.sandbox_spare(node=node.name, event="handed_over")
    records.sandbox_mark_ready(sandbox_id=row.id)
    logger.info(
        "sandbox %s: a spare handed over in %.0f ms (pid %s)",
        row.id,
        (time.monotonic() - started) * 1000,
        spare.pid,
    )
    _seed_history(spare, exclude_run=exclude_run)
    return spare


def sandbox_spawn(
    node: Node, spec: SandboxSpec, *, exclude_run: uuid.UUID | None = None
) -> SandboxProcess:
    """Start a runtime process for ``spec`` on this node and wait for its ``ready``; seed
    it with the conversation's earlier turns (capability ``history``) or store a notice
    that it starts without them. Raises :class:`SandboxError` (``sandbox_start``,
    ``capacity``)."""
    _make_room(node)
    try:
        row = _sandbox_row_create(node, spec)
    except BaseException:
        node.pool.release()
        raise
    sandbox = SandboxProcess(
        sandbox_id=row.id,
        spec=spec,
        sink=node.pipeline.submit,
        reader=node.reader,
        on_network_refused=network_refusal_notice,
    )
    added = False
    try:
        sandbox.start()
        node.pool.add(sandbox, reserved=True)
        added = True
        started = time.monotonic()
        sandbox.wait_ready(ready_timeout())
        runtime_gate(sandbox)
    except (SandboxError, OSError, RuntimeError) as exc:
        metrics.sandbox_spawned(node=node.name, ok=False)
        _sandbox_dead(node, sandbox, counted=added)
        if isinstance(exc, SandboxError):
            raise
        raise SandboxError(
            f"the agent runtime could not be started: {exc}", code="sandbox_start"
        ) from exc
    metrics.sandbox_spawned(node=node.name, ok=True)
    records.sandbox_mark_ready(
        sandbox_id=row.id,
        pid=sandbox.pid,
        command=" ".join(sandbox.command)[:1000],
        capabilities=sorted(sandbox.capabilities),
    )
    logger.info(
        "sandbox %s ready in %.0f ms (pid %s)",
        row.id,
        (time.monotonic() - started) * 1000,
        sandbox.pid,
    )
    _ungated_notice(sandbox)
    _seed_history(sandbox, exclude_run=exclude_run)
    return sandbox


#: What every conversation on an ungated runtime is told at its first run there.
UNGATED_NOTICE = (
    "This runtime runs its tools without asking; approvals apply to paw-agent only. Its "
    "commands and file changes happen before PAW hears of them: PAW can end a run after a "
    "call it would have asked you about, not prevent it."
)


def runtime_gate(sandbox: SandboxProcess) -> None:
    """Refuse a sandbox whose runtime is ungated (its ``ready`` offers no
    ``approval_gate``: :func:`~sandboxes.protocol.runtime_gated`) unless the operator
    accepted that (``PAW_ALLOW_UNGATED_RUNTIME``). Raises :class:`SandboxError`
    ``runtime_ungated`` (the run ends ``error`` with it; the caller kills the sandbox)."""
    if runtime_gated(sandbox.capabilities) or settings.PAW_ALLOW_UNGATED_RUNTIME:
        return
    program = Path(runtime_argv()[0]).name  # what the sandbox was just started from
    raise SandboxError(
        f"the agent runtime ({program}) runs its tools without asking for approval (its ready "
        "offers no approval_gate), so PAW does not run it: approvals apply to paw-agent "
        "only. Use paw-agent (PAW_HARNESS_CMD), or set PAW_ALLOW_UNGATED_RUNTIME=1 to run "
        "it knowingly.",
        code="runtime_ungated",
    )


def _ungated_notice(sandbox: SandboxProcess) -> None:
    """Tell the person, at the first run of the conversation on an ungated runtime, that
    its tools run without asking: a ``notice`` ``runtime_ungated`` that the sandbox's
    next ``start`` line carries along (:attr:`SandboxProcess.start_notices`: stored and
    sent with the run's lines, never written here, so a slow database does not hold the
    run up). Once per stretch: not again while no gated sandbox of the conversation
    started since it was told (its next run, a respawn after an idle shutdown)."""
    if runtime_gated(sandbox.capabilities):
        return
    told_at = event_selectors.notice_latest_at(
        conversation_id=sandbox.conversation_id, code="runtime_ungated"
    )
    if told_at is not None:
        since = (
            Sandbox.objects.filter(conversation_id=sandbox.conversation_id, started_at__gt=told_at)
            .exclude(id=sandbox.sandbox_id)
            .values_list("capabilities", flat=True)
        )
        if not any(runtime_gated(capabilities) for capabilities in since):
            return
    sandbox.start_notices.append(HostNotice(code="runtime_ungated", message=UNGATED_NOTICE))


def _memory_reseed(
    node: Node, sandbox: SandboxProcess, *, run_id: uuid.UUID
) -> SandboxProcess | None:
    """Before a run that replaces the last turn (an edit or a regenerate): make the live
    sandbox's memory the conversation's turns without the replaced ones. A runtime with
    capability ``history`` is given them again (``history`` replaces its memory; the
    kernel and its variables stay); one without is stopped (returns ``None``), and the
    sandbox spawned for the run is seeded as after any restart."""
    if "history" in sandbox.capabilities:
        turns = run_selectors.conversation_turns(
            conversation_id=sandbox.conversation_id, limit=memory_exchanges(), exclude_run=run_id
        )
        sandbox.send("history", turns=turns)  # also [], which empties the memory
        return sandbox
    logger.info(
        "sandbox %s: its runtime cannot replace its memory; restarting it", sandbox.sandbox_id
    )
    sandbox.stop()
    node.pool.discard(sandbox)
    return None


def network_refusal_notice(sandbox: SandboxProcess, destination: str, reason: str) -> None:
    """Tell the person, once per run, that the sandbox's code tried a destination its run
    may not reach (``notice`` ``network_refused``; the node log has every refusal).
    Called from a helper thread of the node's network forwarder."""
    run = sandbox.active or sandbox.last_run
    run_id = run.run_id if run is not None else None
    if run_id in sandbox.network_noticed:
        return
    sandbox.network_noticed.add(run_id)
    try:
        event_services.notice_append(
            conversation_id=sandbox.conversation_id,
            run_id=run_id,
            code="network_refused",
            message=(
                f"The sandbox tried to reach {destination}, which is not allowed for this run "
                f"({reason}). A sandbox reaches only its model endpoint, its datasources and "
                "the hosts the operator allowed (PAW_SANDBOX_ALLOWED_HOSTS)."
            ),
        )
    finally:
        connection.close()  # the forwarder's thread: give the pooled connection back


def _seed_history(sandbox: SandboxProcess, *, exclude_run: uuid.UUID | None) -> None:
    turns = run_selectors.conversation_turns(
        conversation_id=sandbox.conversation_id,
        limit=memory_exchanges(),
        exclude_run=exclude_run,
    )
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
    run = run_selectors.run_for_node(run_id=run_id)
    if run is None or not run.is_active:
        return
    sandbox = node.pool.get(run.conversation_id)
    active = sandbox.active if sandbox is not None else None
    if active is not None and active.run_id == run.id:
        active.cancel()  # written again by the monitor until the run ends
        return
    if run.status == run.Status.RUNNING or sandbox is None:
        known = sandbox.run_of(run.id) if sandbox is not None else None
        run_services.run_finish(
            run_id=run.id, status=run.Status.CANCELLED, usage=known.usage if known else None
        )
    # A run still being dispatched sees cancel_requested itself.


def approval_answer_deliver(*, approval_id: uuid.UUID) -> None:
    """On the owning node: write the ``answer`` op for a decided approval."""
    op = run_selectors.approval_answer_op_for_node(approval_id=approval_id)
    if op is None:
        return
    if not current_node().answer_deliver(op):
        logger.info("approval %s: its run is no longer in a sandbox here", approval_id)


def sandbox_stop_deliver(*, conversation_id: uuid.UUID) -> None:
    """On the owning node: shut the conversation's sandbox down; remove the workspace when
    the conversation no longer exists (deleted while its sandbox ran)."""
    node = current_node()
    with node.pool.conversation_lock(conversation_id):
        sandbox = node.pool.get(conversation_id)
        if sandbox is not None:
            if sandbox.active is not None:
                sandbox.active.mark_forced(
                    code="sandbox_stopped", message="the sandbox was stopped"
                )
            sandbox.stop()
            node.pool.discard(sandbox)
    if not run_selectors.conversation_exists(conversation_id=conversation_id):
        workspace_remove(conversation_id)


# --- reaping (Celery beat) -------------------------------------------------------------------


def nodes_reap() -> dict[str, int]:
    """Close what silent nodes left behind, and re-send runs whose task was lost.

    A node without a heartbeat for ``PAW_NODE_DEAD_SECONDS`` is lost: its live sandboxes
    become ``dead``, its active runs end ``error`` ("worker lost") and their pending
    approvals are cancelled. Runs queued for over a minute are enqueued again (execution
    is idempotent), which recovers tasks an in-memory broker lost on a restart. Events
    that went live but were never stored (their writer was lost between the two) are
    stored (``events_reconcile``).
    Returns counts: ``{"nodes", "sandboxes", "runs", "requeued", "events"}``.
    """
    lost = lost_node_names(silent_for_seconds=settings.PAW_NODE_DEAD_SECONDS)
    gone = lost + stopped_node_names()
    sandboxes = records.nodes_sandboxes_mark_dead(nodes=gone)
    runs = 0
    for run_id in run_selectors.run_ids_active_on_nodes(nodes=gone):
        if run_services.run_fail(
            run_id=run_id,
            code="worker_lost",
            message="worker lost: the node running this run stopped answering",
        ):
            runs += 1
    if lost:
        records.nodes_mark_lost(names=lost)
    requeued = runs_requeue(older_than_seconds=60)
    try:
        events = event_services.events_reconcile()
    except Exception:  # Redis away: the next round does it
        logger.exception("reaper: the live logs could not be reconciled")
        events = 0
    return {
        "nodes": len(lost),
        "sandboxes": sandboxes,
        "runs": runs,
        "requeued": requeued,
        "events": events,
    }


def runs_requeue(*, older_than_seconds: float) -> int:
    """Enqueue again every run still ``queued`` after ``older_than_seconds`` (its task may
    be lost: execution is idempotent, so a duplicate does no harm). Returns how many.

    The reaper uses a minute; an embedded PAW starting up uses 0, because its in-memory
    broker lost every task of the process before it."""
    cutoff = timezone.now() - timedelta(seconds=older_than_seconds)
    queued = run_selectors.runs_queued_before(cutoff=cutoff)
    for run_id, conversation_id in queued:
        run_execute_enqueue(run_id=run_id, conversation_id=conversation_id)
    return len(queued)
