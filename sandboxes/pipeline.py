"""The node's event pipeline: runtime lines → stored events → live fan-out.

Reader threads (one per sandbox) hand parsed lines to one writer thread per node. The
writer takes whatever has queued (one line when the pipe is quiet, up to
``MAX_BATCH_LINES`` when it is busy), stores it in one transaction — cursors, events and
their effects on runs, approvals and sandboxes — and, after commit, sends each
conversation's events as one channel-layer message followed by the status messages the
effects produced. Storing before sending is what lets a client resume without a gap.

Effects of lines (the runtime is untrusted: lines are attributed to the run the host
submitted, never to the ``run_id`` the runtime writes):

- ``start`` → the run is ``running``;
- ``notify ask`` → an :class:`~conversations.models.Approval` (auto-approved at once when
  the conversation says so and it is a confirm);
- ``notify usage`` (running totals) → the run's budgets are checked
  (:class:`~billing.services.RunBudgetGuard`); past one, the run is force-ended with
  ``budget_exceeded``;
- ``result`` → the run is finished with its answer, errors, model and usage (billed:
  the larger of the result's totals and the last running totals);
- the process exiting → its run (if any) ends ``error`` "sandbox exited (code N)", billed
  for the last running totals it reported.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from billing.services import RunBudgetGuard, usage_merge, usage_normalize
from conversations.models import Approval, Conversation, Run
from conversations.services import approvals as approval_services
from conversations.services import events as event_services
from conversations.services import runs as run_services
from sandboxes import protocol
from sandboxes.models import Sandbox
from sandboxes.pool import ReadEntry, SandboxProcess

logger = logging.getLogger(__name__)

MAX_BATCH_LINES = 2000
QUEUE_MAX_ITEMS = 20_000
RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)
MAX_TEXT = 100_000


@dataclass
class _Item:
    sandbox: SandboxProcess
    entries: list[ReadEntry] | None
    returncode: int | None = None


@dataclass
class _Effects:
    """Work found in a batch, applied in the same transaction after the events."""

    started: list[tuple[SandboxProcess, uuid.UUID]] = field(default_factory=list)
    asks: list[tuple[SandboxProcess, uuid.UUID, dict[str, Any]]] = field(default_factory=list)
    results: list[tuple[SandboxProcess, uuid.UUID, dict[str, Any]]] = field(default_factory=list)
    gated: list[tuple[SandboxProcess, uuid.UUID, list[str]]] = field(default_factory=list)
    # The latest running totals per run in the batch (only the last one needs a check).
    usage: dict[uuid.UUID, tuple[SandboxProcess, dict[str, Any]]] = field(default_factory=dict)


def _payload(entry: ReadEntry) -> tuple[str, str, dict[str, Any]]:
    """``(type, kind, payload)`` to store for a read line."""
    line = entry.line
    if isinstance(line, protocol.Anomaly):
        return "notice", "protocol", {
            "type": "notice", "level": "warning", "code": "protocol", "message": line.message,
        }  # fmt: skip
    if isinstance(line, protocol.Malformed):
        return "log", "malformed", {
            "type": "log", "message": line.text, "malformed": True, "reason": line.reason,
        }  # fmt: skip
    kind = line.kind if isinstance(line, protocol.RunLine) else ""
    return line.type, kind, line.raw


def result_outcome(raw: dict[str, Any], forced: tuple[str, str] | None) -> dict[str, Any]:
    """The run's final state from a ``result`` line (PROTOCOL.md: the only source of truth
    for the outcome). ``forced`` is the host's own reason when it ended the run (timeout,
    budget, policy): a cancelled result then ends the run ``error`` with that code."""
    errors = []
    for item in raw.get("errors") or []:
        if isinstance(item, dict):
            errors.append(
                run_services.error_entry(
                    str(item.get("code") or "unknown")[:64], str(item.get("message") or "")[:5000]
                )
            )
        elif isinstance(item, str):
            errors.append(run_services.error_entry("unknown", item[:5000]))
    usage = usage_normalize(raw.get("usage"))
    if forced is not None:
        status = Run.Status.ERROR
        errors = [run_services.error_entry(*forced)]
    elif raw.get("cancelled") is True:
        status = Run.Status.CANCELLED
    elif errors:
        status = Run.Status.ERROR
    else:
        status = Run.Status.DONE
    answer = raw.get("answer") if isinstance(raw.get("answer"), str) else ""
    model = raw.get("model") if isinstance(raw.get("model"), str) else ""
    return {
        "status": status,
        "answer": answer[:MAX_TEXT],
        "errors": errors,
        "model": model,
        "usage": usage,
    }


class EventPipeline:
    """One writer thread per node (see the module docstring). ``submit`` is the sink the
    sandboxes' reader threads call; it blocks when ``QUEUE_MAX_ITEMS`` are waiting, which
    makes a runtime that outpaces the database wait on its own stdout: nothing is lost."""

    def __init__(self) -> None:
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=QUEUE_MAX_ITEMS)
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._on_exit: list[Any] = []
        self._budgets = RunBudgetGuard()  # used by the writer thread only

    def start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name="event-pipeline", daemon=True)
            self._thread.start()

    def on_exit(self, callback: Any) -> None:
        """Call ``callback(sandbox)`` after a sandbox's exit has been recorded."""
        self._on_exit.append(callback)

    def submit(
        self,
        sandbox: SandboxProcess,
        entries: list[ReadEntry] | None,
        returncode: int | None = None,
    ) -> None:
        """Queue lines read from ``sandbox`` (or, with ``entries=None``, its exit)."""
        self._idle.clear()
        self._queue.put(_Item(sandbox, entries, returncode))

    def drain(self, timeout: float) -> bool:
        """Wait until everything queued so far is stored and sent; ``False`` on timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._queue.empty() and self._idle.wait(0.05):
                return True
            time.sleep(0.01)
        return False

    def stop(self, timeout: float = 10.0) -> None:
        self.drain(timeout)
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout)

    # --- the writer thread ------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            items = [item]
            lines = len(item.entries or ())
            while lines < MAX_BATCH_LINES:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                items.append(more)
                lines += len(more.entries or ())
            try:
                self._process(items)
            except Exception:
                logger.exception("event pipeline: a batch failed")
            if self._queue.empty():
                self._idle.set()
        connection.close()

    def _process(self, items: list[_Item]) -> None:
        # Lines first (in order), then exits: an exit item only ever follows its own lines.
        lines = [item for item in items if item.entries]
        if lines:
            self._with_retries(self._store, lines)
        for item in items:
            if item.entries is None:
                self._with_retries(self._exit, item)

    def _with_retries(self, func: Any, arg: Any) -> None:
        """Run ``func(arg)``; on a lost database connection retry with backoff (the queue
        holds the lines meanwhile). Other errors are logged and the batch is skipped."""
        for delay in (*RETRY_DELAYS, None):
            try:
                func(arg)
                return
            except (OperationalError, InterfaceError) as exc:
                if delay is None:
                    logger.exception("event pipeline: database unavailable, batch dropped")
                    return
                logger.warning(
                    "event pipeline: database error (%s); retrying in %.1f s", exc, delay
                )
                connection.close()
                time.sleep(delay)

    def _store(self, items: list[_Item]) -> None:
        by_conversation: dict[uuid.UUID, list[tuple[SandboxProcess, ReadEntry]]] = defaultdict(list)
        for item in items:
            for entry in item.entries or ():
                by_conversation[item.sandbox.conversation_id].append((item.sandbox, entry))
        try:
            self._store_conversations(by_conversation)
        except (OperationalError, InterfaceError):
            raise
        except DatabaseError:
            # One conversation's trouble (deleted mid-run) must not hold the others back.
            for conversation_id, entries in by_conversation.items():
                try:
                    self._store_conversations({conversation_id: entries})
                except (OperationalError, InterfaceError):
                    raise
                except (DatabaseError, Conversation.DoesNotExist):
                    logger.warning(
                        "event pipeline: dropping %d line(s) of conversation %s",
                        len(entries),
                        conversation_id,
                    )
        except Conversation.DoesNotExist:
            for conversation_id, entries in by_conversation.items():
                try:
                    self._store_conversations({conversation_id: entries})
                except Conversation.DoesNotExist:
                    logger.info(
                        "conversation %s is gone; its sandbox's lines are dropped", conversation_id
                    )

    def _store_conversations(
        self, by_conversation: dict[uuid.UUID, list[tuple[SandboxProcess, ReadEntry]]]
    ) -> None:
        effects = _Effects()
        with transaction.atomic():
            # Lock conversation rows in one order, so two writers can never deadlock.
            for conversation_id in sorted(by_conversation):
                entries = by_conversation[conversation_id]
                drafts = []
                for sandbox, entry in entries:
                    line_type, kind, payload = _payload(entry)
                    if line_type in ("start", "result"):
                        held = sandbox.flush_stream()  # a stream's last piece, before its end
                        if held and line_type == "result":
                            drafts.append(
                                event_services.EventDraft(
                                    run_id=entry.run_id, type="delta",
                                    payload={"type": "delta", "text": held, "run_id": str(entry.run_id)},
                                )
                            )  # fmt: skip
                    payload = sandbox.mask(payload)
                    drafts.append(
                        event_services.EventDraft(
                            run_id=entry.run_id, type=line_type, kind=kind, payload=payload
                        )
                    )
                    self._collect(effects, sandbox, entry, payload)
                events = event_services.events_append(
                    conversation_id=conversation_id, drafts=drafts
                )
                transaction.on_commit(
                    lambda cid=conversation_id, evs=events: event_services._safe(
                        event_services.events_publish, conversation_id=cid, events=evs
                    )
                )
            self._apply(effects)

    @staticmethod
    def _collect(
        effects: _Effects, sandbox: SandboxProcess, entry: ReadEntry, payload: dict[str, Any]
    ) -> None:
        line = entry.line
        if entry.run_id is None or not isinstance(line, protocol.RunLine):
            return
        if line.type == "start":
            effects.started.append((sandbox, entry.run_id))
        elif line.type == "result":
            effects.results.append((sandbox, entry.run_id, payload))
        elif line.type == "notify" and line.kind == "ask" and isinstance(payload.get("data"), dict):
            effects.asks.append((sandbox, entry.run_id, payload["data"]))
        elif line.type == "notify" and line.kind == "usage":
            effects.usage[entry.run_id] = (sandbox, usage_normalize(payload.get("data")))
        elif (
            line.type == "notify"
            and line.kind == "tool_calls"
            and isinstance(payload.get("data"), list)
        ):
            required = set(settings.PAW_APPROVAL_REQUIRED_TOOLS)
            names = [
                c.get("name")
                for c in payload["data"]
                if isinstance(c, dict) and c.get("name") in required
            ]
            if names:
                effects.gated.append((sandbox, entry.run_id, names))

    def _apply(self, effects: _Effects) -> None:
        now = timezone.now()
        for _, run_id in effects.started:
            run_services.run_mark_running(run_id=run_id)
        finished = {s.sandbox_id for s, _, _ in effects.results}
        busy = {s.sandbox_id for s, _ in effects.started} - finished
        if busy:
            Sandbox.objects.filter(id__in=busy, state=Sandbox.State.READY).update(
                state=Sandbox.State.BUSY, last_active_at=now
            )
        for sandbox, run_id, data in effects.asks:
            run = (
                Run.objects.filter(id=run_id, status__in=Run.ACTIVE_STATUSES)
                .select_related("conversation")
                .first()
            )
            if run is None:
                continue
            approval = approval_services.approval_create(run=run, data=data)
            if approval.kind == Approval.Kind.CONFIRM and run.conversation.auto_approve:
                # Decided at once: the tabs hear of the decision only, nobody is asked.
                transaction.on_commit(lambda s=sandbox, a=approval.id: _auto_approve(s, a))
                continue
            request = approval_services.approval_request_message(approval)
            transaction.on_commit(
                lambda cid=run.conversation_id, message=request: event_services._safe(
                    event_services.message_publish, conversation_id=cid, message=message
                )
            )
        for sandbox, run_id, names in effects.gated:
            self._check_policy(sandbox, run_id, names)
        ended = {run_id for _, run_id, _ in effects.results}
        for run_id, (sandbox, usage) in effects.usage.items():
            if run_id not in ended:
                self._check_budget(sandbox, run_id, usage)
        for sandbox, run_id, raw in effects.results:
            outcome = result_outcome(raw, sandbox.forced_outcome.pop(run_id, None))
            outcome["usage"] = usage_merge(outcome["usage"], sandbox.run_usage.pop(run_id, None))
            self._budgets.forget(run_id)
            run_services.run_finish(run_id=run_id, **outcome)
            Sandbox.objects.filter(id=sandbox.sandbox_id, state=Sandbox.State.BUSY).update(
                state=Sandbox.State.READY, last_active_at=now
            )

    def _check_budget(
        self, sandbox: SandboxProcess, run_id: uuid.UUID, usage: dict[str, Any]
    ) -> None:
        """Stop a run that went past its token budget (per run or monthly): a ``cancel``
        after commit; the run then ends ``error`` ``budget_exceeded``, billed for what
        it used. Cheap: the run's limits are cached (:class:`RunBudgetGuard`)."""
        reason = self._budgets.check(run_id=run_id, usage=usage)
        if reason is None or run_id in sandbox.forced_outcome:
            return
        logger.warning("run %s: token budget exceeded; stopping it", run_id)
        transaction.on_commit(
            lambda: sandbox.force_end(run_id, code="budget_exceeded", message=reason)
        )

    @staticmethod
    def _check_policy(sandbox: SandboxProcess, run_id: uuid.UUID, names: list[str]) -> None:
        """The host does not trust the runtime to ask: each call of a tool in
        ``PAW_APPROVAL_REQUIRED_TOOLS`` must be covered by an approved confirm of the same
        run. An uncovered call stops the run and is recorded as a ``policy_violation``."""
        approved = Approval.objects.filter(
            run_id=run_id, kind=Approval.Kind.CONFIRM, status=Approval.Status.APPROVED
        ).count()
        used = sandbox.gated_calls.get(run_id, 0)
        sandbox.gated_calls[run_id] = used + len(names)
        if used + len(names) <= approved:
            return
        tools = ", ".join(sorted(set(names)))
        message = f"The agent tried to use {tools} without your approval, so PAW stopped the run."
        run = Run.objects.filter(id=run_id).only("conversation_id").first()
        if run is None:
            return
        (event,) = event_services.events_append(
            conversation_id=run.conversation_id,
            drafts=[
                event_services.EventDraft(
                    run_id=run_id,
                    type="policy_violation",
                    kind="approval_required",
                    payload={
                        "type": "policy_violation",
                        "tools": sorted(set(names)),
                        "message": message,
                    },
                )
            ],
        )
        logger.warning("run %s: policy violation (%s without an approved confirm)", run_id, tools)
        transaction.on_commit(
            lambda: event_services._safe(
                event_services.events_publish, conversation_id=run.conversation_id, events=[event]
            )
        )
        transaction.on_commit(
            lambda: sandbox.force_end(run_id, code="policy_violation", message=message)
        )

    def _exit(self, item: _Item) -> None:
        """Record a sandbox's end and end its run, if one was still going."""
        sandbox = item.sandbox
        code = item.returncode
        tail = sandbox.stderr_tail()
        state = Sandbox.State.STOPPED if sandbox.stopping else Sandbox.State.DEAD
        with transaction.atomic():
            Sandbox.objects.filter(id=sandbox.sandbox_id, state__in=Sandbox.LIVE_STATES).update(
                state=state, stopped_at=timezone.now()
            )
            Sandbox.objects.filter(id=sandbox.sandbox_id).update(
                exit_code=code, stderr_tail=tail[-8000:]
            )
            run_id = sandbox.current_run
            if run_id is not None:
                self._budgets.forget(run_id)
                forced = sandbox.forced_outcome.pop(run_id, None)
                if forced is not None:
                    error_code, message = forced
                else:
                    error_code = "sandbox_exited"
                    message = f"sandbox exited (code {code})"
                    if tail:
                        message += f": {tail[-2000:]}"
                run_services.run_finish(
                    run_id=run_id,
                    status=Run.Status.ERROR,
                    errors=[run_services.error_entry(error_code, sandbox.mask_text(message))],
                    # No result: billed for the last running totals the runtime reported.
                    usage=sandbox.run_usage.pop(run_id, None),
                )
                sandbox.current_run = None
            elif state == Sandbox.State.DEAD:
                event_services.notice_append(
                    conversation_id=sandbox.conversation_id,
                    run_id=None,
                    code="sandbox_exited",
                    message=f"The agent's sandbox exited unexpectedly (code {code}); the next run starts a new one.",
                )
        for callback in self._on_exit:
            callback(sandbox)


def _auto_approve(sandbox: SandboxProcess, approval_id: uuid.UUID) -> None:
    """Approve a confirm on the conversation's behalf and answer the runtime at once."""
    try:
        approval = approval_services.approval_decide(
            approval_id=approval_id, approved=True, decided_by="auto", via="auto"
        )
        sandbox.send(
            "answer", run_id=str(approval.run_id), answers=["yes"], ask_id=approval.ask_id or None
        )
    except Exception:  # the approval stays pending and expires at its deadline
        logger.exception("auto-approve of %s failed", approval_id)
