"""The node's event pipeline: runtime lines → stored events → the domain's effects.

Reader threads (one per sandbox) hand parsed lines to one writer thread per node. The
writer takes whatever has queued (one line when the pipe is quiet, up to
``MAX_BATCH_LINES`` when it is busy), classifies each line once (:func:`classify`), masks
it, and stores the batch in one transaction: each conversation's events with
:func:`~conversations.services.events.events_append` (which sends them to the live group
after commit), then the lines that change their run are handed to the domain
(:class:`~conversations.services.run_effects.RunEffects`: what a line *does* is decided
there), and the sandboxes' own rows are updated (busy, ready). Storing before sending is
what lets a client resume without a gap. A lost database connection is retried with
backoff while the queue holds the lines.

Runs on the node side only.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.utils import timezone

from conversations.services import events as event_services
from conversations.services.events import ConversationGone
from conversations.services.run_effects import LineKind, RunEffects, RunLine
from paw_project import metrics
from sandboxes import protocol
from sandboxes.models import Sandbox
from sandboxes.pool import ReadEntry, SandboxProcess

logger = logging.getLogger(__name__)

MAX_BATCH_LINES = 2000
QUEUE_MAX_ITEMS = 20_000
RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)


@dataclass
class _Item:
    sandbox: SandboxProcess
    entries: list[ReadEntry] | None
    returncode: int | None = None
    received: float = field(default_factory=time.monotonic)  # when it reached the pipeline


#: One line to store: its sandbox, the line, and when it reached the pipeline (monotonic).
_Pending = tuple[SandboxProcess, ReadEntry, float]


#: ``notify`` kinds with an effect on their run.
_NOTIFY_EFFECTS = {
    "ask": LineKind.ASK,
    "tool_calls": LineKind.TOOL_CALLS,
    "tool": LineKind.TOOL,
    "usage": LineKind.USAGE,
}


def classify(entry: ReadEntry) -> tuple[str, str, dict[str, Any], LineKind | None]:
    """What a read line is, decided once: ``(type, kind, payload, effect)`` — the event
    ``type`` and notify ``kind`` it is stored under, the payload to store (unmasked), and
    the :class:`LineKind` of its effect on the run (``None``: none, or a line outside any
    run the host submitted)."""
    line = entry.line
    if isinstance(line, protocol.Anomaly):
        return "notice", "protocol", {
            "type": "notice", "level": "warning", "code": "protocol", "message": line.message,
        }, None  # fmt: skip
    if isinstance(line, protocol.Malformed):
        return "log", "malformed", {
            "type": "log", "message": line.text, "malformed": True, "reason": line.reason,
        }, None  # fmt: skip
    if not isinstance(line, protocol.RunLine):
        return line.type, "", line.raw, None
    effect = None
    if entry.run is not None:
        if line.type == "start":
            effect = LineKind.START
        elif line.type == "result":
            effect = LineKind.RESULT
        elif line.type == "notify":
            effect = _NOTIFY_EFFECTS.get(line.kind)
    return line.type, line.kind, line.raw, effect


def coalesce_deltas(drafts: list[event_services.EventDraft]) -> list[event_services.EventDraft]:
    """``drafts`` with each stretch of consecutive ``delta`` drafts of the same run joined
    into one: its text the pieces' text in order, its other fields the last piece's (so
    its ``seq`` is the last joined line's). Nothing else is merged or moved; a delta
    outside any run stays as it is. Several lines of a run share a batch only when the
    node is behind, so a quiet stream keeps one event per runtime line and a busy one
    stores, sends and renders fewer, larger events (docs/api.md, "What a delta holds")."""
    groups: list[list[event_services.EventDraft]] = []
    for draft in drafts:
        last = groups[-1][-1] if groups else None
        if last is not None and _joinable(draft) and _joinable(last) and last.run_id == draft.run_id:
            groups[-1].append(draft)
        else:
            groups.append([draft])
    return [
        group[0]
        if len(group) == 1
        else replace(
            group[-1],
            payload={**group[-1].payload, "text": "".join(d.payload["text"] for d in group)},
        )
        for group in groups
    ]


def _joinable(draft: event_services.EventDraft) -> bool:
    return (
        draft.type == "delta"
        and draft.run_id is not None
        and isinstance(draft.payload.get("text"), str)
    )


class EventPipeline:
    """One writer thread per node (see the module docstring). ``submit`` is the sink the
    sandboxes' reader threads call; it blocks when ``QUEUE_MAX_ITEMS`` are waiting, which
    makes a runtime that outpaces the database wait on its own stdout: nothing is lost."""

    def __init__(self, *, node: str = "") -> None:
        self.node = node  # the node's name, for its metrics
        self._queue: queue.Queue[_Item | None] = queue.Queue(maxsize=QUEUE_MAX_ITEMS)
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._on_exit: list[Any] = []
        self._effects = RunEffects()  # used by the writer thread only

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
        by_conversation: dict[uuid.UUID, list[_Pending]] = defaultdict(list)
        for item in items:
            for entry in item.entries or ():
                by_conversation[item.sandbox.conversation_id].append(
                    (item.sandbox, entry, item.received)
                )
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
                except (DatabaseError, ConversationGone):
                    logger.warning(
                        "event pipeline: dropping %d line(s) of conversation %s",
                        len(entries),
                        conversation_id,
                    )
        except ConversationGone:
            for conversation_id, entries in by_conversation.items():
                try:
                    self._store_conversations({conversation_id: entries})
                except ConversationGone:
                    logger.info(
                        "conversation %s is gone; its sandbox's lines are dropped", conversation_id
                    )

    def _store_conversations(self, by_conversation: dict[uuid.UUID, list[_Pending]]) -> None:
        lines: list[RunLine] = []
        started: set[uuid.UUID] = set()
        finished: set[uuid.UUID] = set()
        # Runs with streamed text in this batch: (the run, when its first delta arrived).
        streamed: dict[uuid.UUID, tuple[Any, float]] = {}
        with transaction.atomic():
            # Lock conversation rows in one order, so two writers can never deadlock.
            for conversation_id in sorted(by_conversation):
                drafts = []
                for sandbox, entry, received in by_conversation[conversation_id]:
                    line_type, kind, payload, effect = classify(entry)
                    if line_type == "delta" and entry.run is not None:
                        streamed.setdefault(entry.run.run_id, (entry.run, received))
                    if effect in (LineKind.START, LineKind.RESULT):
                        held = sandbox.flush_stream()  # a stream's last piece, before its end
                        if held and effect is LineKind.RESULT:
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
                    if effect is None or entry.run is None:
                        continue
                    data = payload if effect is LineKind.RESULT else payload.get("data")
                    lines.append(RunLine(run=entry.run, kind=effect, data=data))
                    if effect is LineKind.USAGE:
                        entry.run.record_usage(data)
                    elif effect is LineKind.START:
                        started.add(sandbox.sandbox_id)
                    elif effect is LineKind.RESULT:
                        finished.add(sandbox.sandbox_id)
                event_services.events_append(
                    conversation_id=conversation_id, drafts=coalesce_deltas(drafts)
                )
            self._effects.apply(lines)
            now = timezone.now()
            if started - finished:
                Sandbox.objects.filter(id__in=started - finished, state=Sandbox.State.READY).update(
                    state=Sandbox.State.BUSY, last_active_at=now
                )
            if finished:
                Sandbox.objects.filter(id__in=finished, state=Sandbox.State.BUSY).update(
                    state=Sandbox.State.READY, last_active_at=now
                )
        # Committed, and (on commit) sent to the live groups.
        metrics.relay_stored(
            node=self.node,
            arrivals=(received for pending in by_conversation.values() for *_, received in pending),
        )
        for run, received in streamed.values():
            if not run.first_token:
                run.first_token = True
                if run.queued_at is not None:
                    metrics.run_first_token(queued_at=run.queued_at, arrived=received)

    def _exit(self, item: _Item) -> None:
        """Record a sandbox's end and end its run, if one was still going."""
        sandbox = item.sandbox
        tail = sandbox.stderr_tail()
        state = Sandbox.State.STOPPED if sandbox.stopping else Sandbox.State.DEAD
        run = sandbox.active
        with transaction.atomic():
            Sandbox.objects.filter(id=sandbox.sandbox_id, state__in=Sandbox.LIVE_STATES).update(
                state=state, stopped_at=timezone.now()
            )
            Sandbox.objects.filter(id=sandbox.sandbox_id).update(
                exit_code=item.returncode, stderr_tail=tail[-8000:]
            )
            self._effects.sandbox_exited(
                run=run,
                conversation_id=sandbox.conversation_id,
                exit_code=item.returncode,
                stderr_tail=sandbox.mask_text(tail),
                expected=state == Sandbox.State.STOPPED,
            )
        if state == Sandbox.State.DEAD:
            metrics.sandbox_crashed(node=self.node)
        if run is not None:
            run.close()  # after commit: a retried transaction still finds the run
        for callback in self._on_exit:
            callback(sandbox)
