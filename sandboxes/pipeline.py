"""The node's event pipeline: runtime lines → events → the domain's effects.

The node's reader thread (``sandboxes.reader.OutputReader``) hands the reads of one round,
every sandbox's, to :meth:`EventPipeline.submit_many`, which prepares them at once, in
that thread: classifies each line once (:func:`classify`), masks it, and joins
consecutive deltas (:func:`coalesce_deltas`: a read holds one line when the pipe is
quiet, many when the runtime is ahead, so a busy stream becomes fewer, larger events).
Then:

* **Redis mode**: the events go live at once through the conversations' live logs
  (``events_relay_many``: cursors, the streams, the websockets; one round trip for the
  round), still in the reader thread, and are queued for the node's writer thread,
  which stores whatever has queued in one transaction (``events_store``, with their
  cursors), hands the lines that change their run to the domain
  (:class:`~conversations.services.run_effects.RunEffects`: what a line *does* is
  decided there) and updates the sandboxes' own rows (busy, ready). The database write
  is off the latency path; readers merge the live log and the database, so a client
  resumes without a gap (docs/api.md, "The live path").
* **Embedded mode**: the writer stores the events first (``events_append``: cursors in
  commit order) and they are sent after commit; effects as above.

A lost database connection is retried with backoff, until it works, while the queue holds
the batches; an unreachable Redis is retried by the reader, which stops reading meanwhile
(the runtimes then wait on their own stdout: nothing is lost). At most
:data:`MAX_UNSTORED_EVENTS` events sent live wait for the writer.

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

import redis
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction

from conversations.services import events as event_services
from conversations.services.events import ConversationGone, EventDraft, StoredEvent
from conversations.services.run_effects import LineKind, RunEffects, RunLine, SqlCall
from paw_project import live_log, metrics
from sandboxes import protocol, records
from sandboxes.process import SandboxProcess
from sandboxes.run import ActiveRun, ReadEntry

logger = logging.getLogger(__name__)

MAX_BATCH_LINES = 2000
QUEUE_MAX_ITEMS = 20_000
#: Events sent live and not stored yet that the node holds at most: past it, reading
#: waits for the writer (the runtimes then wait on their stdout). It bounds what a Redis
#: restart can find in flight (``paw_project.live_log.RESEED_GAP`` is well above it).
MAX_UNSTORED_EVENTS = 20_000
#: Seconds between attempts to store a batch (the database away) or to send a read's
#: events (Redis away, or the database a new counter is seeded from): the last one
#: repeats until it works. Nothing is dropped: reading waits meanwhile.
RETRY_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)


@dataclass
class _Batch:
    """The lines of one read, prepared (or, with ``is_exit``, the sandbox's exit): their
    ``drafts``, the same ``events`` with cursors once relayed (Redis mode; ``held``: the
    last of them, from a run's ``result`` on, put in the live log but published only once
    their effects are committed), the ``effects`` on their run, whether a run
    ``started`` or ``finished`` in them, ``streamed``: the run with text in them, and
    ``lines``: how many runtime lines they came from."""

    sandbox: SandboxProcess
    drafts: list[EventDraft] = field(default_factory=list)
    events: list[StoredEvent] | None = None
    held: list[StoredEvent] = field(default_factory=list)
    effects: list[RunLine] = field(default_factory=list)
    started: bool = False
    finished: bool = False
    streamed: ActiveRun | None = None
    lines: int = 0
    exit_code: int | None = None
    is_exit: bool = False
    received: float = field(default_factory=time.monotonic)  # when it reached the pipeline


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
    if isinstance(line, protocol.HostNotice):
        return "notice", line.code, {
            "type": "notice", "level": line.level, "code": line.code, "message": line.message,
        }, None  # fmt: skip
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
        if (
            last is not None
            and _joinable(draft)
            and _joinable(last)
            and last.run_id == draft.run_id
        ):
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


def prepare(sandbox: SandboxProcess, entries: list[ReadEntry]) -> _Batch:
    """The events and effects of one read's lines (see the module docstring). Call from
    the sandbox's reader thread: the masking of streamed text keeps state per sandbox."""
    batch = _Batch(sandbox=sandbox, lines=len(entries))
    for entry in entries:
        line_type, kind, payload, effect = classify(entry)
        # What a runtime names a line or a notify kind is its own text too: masked like the
        # rest (they are stored and shown as the event's type and kind).
        line_type, kind = sandbox.mask_text(line_type), sandbox.mask_text(kind)
        if line_type == "delta" and entry.run is not None and batch.streamed is None:
            batch.streamed = entry.run
        if effect in (LineKind.START, LineKind.RESULT):
            held = sandbox.flush_stream()  # a stream's last piece, before its end
            if held and effect is LineKind.RESULT:
                batch.drafts.append(
                    EventDraft(
                        run_id=entry.run_id, type="delta",
                        payload={"type": "delta", "text": held, "run_id": str(entry.run_id)},
                    )
                )  # fmt: skip
        payload = sandbox.mask(payload)
        if isinstance(entry.line, protocol.Malformed):  # masked whole first, then cut
            payload["message"] = payload["message"][: protocol.MALFORMED_TEXT_CHARS]
        batch.drafts.append(
            EventDraft(run_id=entry.run_id, type=line_type, kind=kind, payload=payload)
        )
        if effect is None or entry.run is None:
            continue
        data = payload if effect is LineKind.RESULT else payload.get("data")
        if effect is LineKind.RESULT:  # a call the run ended before its result came
            batch.effects += _sql_lines(entry.run, entry.run.sql_calls_unfinished())
        batch.effects.append(RunLine(run=entry.run, kind=effect, data=data))
        if effect is LineKind.TOOL_CALLS:
            entry.run.sql_calls_announced(data)
        elif effect is LineKind.TOOL:
            ended = entry.run.sql_call_ended(data)
            batch.effects += _sql_lines(entry.run, [ended] if ended is not None else [])
        elif effect is LineKind.USAGE:
            entry.run.record_usage(data)
        elif effect is LineKind.START:
            batch.started = True
        elif effect is LineKind.RESULT:
            batch.finished = True
    batch.drafts = coalesce_deltas(batch.drafts)
    return batch


def _sql_lines(run: ActiveRun, calls: list[SqlCall]) -> list[RunLine]:
    """The audit's effects of ``run``'s paired ``run_sql`` calls (one ``sql`` line each)."""
    return [RunLine(run=run, kind=LineKind.SQL, data=call) for call in calls]


class EventPipeline:
    """One writer thread per node (see the module docstring). ``submit`` is the sink the
    sandboxes' reader threads call; it blocks when ``QUEUE_MAX_ITEMS`` batches are
    waiting, which makes a runtime that outpaces the database wait on its own stdout:
    nothing is lost."""

    def __init__(self, *, node: str = "") -> None:
        self.node = node  # the node's name, for its metrics
        self._queue: queue.Queue[_Batch | None] = queue.Queue(maxsize=QUEUE_MAX_ITEMS)
        self._thread: threading.Thread | None = None
        self._idle = threading.Event()
        self._idle.set()
        self._on_exit: list[Any] = []
        self._effects = RunEffects()  # used by the writer thread only
        self._room = threading.Condition()
        self._unstored = 0  # events sent live, not stored yet (MAX_UNSTORED_EVENTS)

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
        """Take lines read from ``sandbox`` (or, with ``entries=None``, its exit): in Redis
        mode they are sent live before this returns; stored by the writer thread."""
        if entries is None:
            self._idle.clear()
            self._queue.put(_Batch(sandbox=sandbox, exit_code=returncode, is_exit=True))
            return
        self.submit_many([(sandbox, entries)])

    def submit_many(self, reads: list[tuple[SandboxProcess, list[ReadEntry]]]) -> None:
        """Take the lines of several reads (``(sandbox, entries)``, in the order they were
        read; what the node's ``OutputReader`` took in one round): in Redis mode they all
        go live in one round trip before this returns; stored by the writer thread."""
        self._idle.clear()
        batches = [prepare(sandbox, entries) for sandbox, entries in reads]
        if live_log.enabled():
            with self._room:
                while self._unstored >= MAX_UNSTORED_EVENTS:
                    self._room.wait(1.0)
            self._relay(batches)
            with self._room:
                self._unstored += sum(len(batch.events or ()) for batch in batches)
        for batch in batches:
            self._queue.put(batch)

    def _relay(self, batches: list[_Batch]) -> None:
        """Give the batches' events their cursors and send them live, in one round trip
        (retrying while Redis, or the database a lost counter is seeded from, is away:
        reading waits meanwhile). A run's result goes out once the run is
        finished in the database (a client that gets it may ask for the run): from it on,
        a batch's events are put in the live log now and published on commit (``held``)."""
        appends: list[tuple[uuid.UUID, list[EventDraft], bool]] = []
        for batch in batches:
            drafts = batch.drafts
            hold = next(
                (i for i, d in enumerate(drafts) if d.type == "result" and d.run_id), len(drafts)
            )
            cid = batch.sandbox.conversation_id
            appends += [(cid, drafts[:hold], True), (cid, drafts[hold:], False)]
        attempt = 0
        while True:
            try:
                relayed = event_services.events_relay_many(appends=appends)
                break
            except (redis.RedisError, DatabaseError) as exc:
                delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
                attempt += 1
                logger.warning(
                    "event pipeline: cannot send %d read(s) live (%s); retrying in %.1f s",
                    len(batches), exc, delay,
                )  # fmt: skip
                if isinstance(exc, DatabaseError):
                    connection.close()
                time.sleep(delay)
        for index, batch in enumerate(batches):
            now, held = relayed[2 * index], relayed[2 * index + 1]
            batch.events, batch.held = now + held, held
            if batch.events:
                self._sent(batch)

    def _sent(self, batch: _Batch) -> None:
        """Metrics of a batch whose events went out: the read→send lag, the first token."""
        metrics.relay_sent(arrivals=[batch.received] * batch.lines)
        run = batch.streamed
        if run is not None and not run.first_token:
            run.first_token = True
            if run.queued_at is not None:
                metrics.run_first_token(queued_at=run.queued_at, arrived=batch.received)

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
            batches = [item]
            lines = item.lines
            while lines < MAX_BATCH_LINES:
                try:
                    more = self._queue.get_nowait()
                except queue.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                batches.append(more)
                lines += more.lines
            try:
                self._process(batches)
            except Exception:
                logger.exception("event pipeline: a batch failed")
            with self._room:
                self._unstored -= sum(len(batch.events or ()) for batch in batches)
                self._room.notify_all()
            if self._queue.empty():
                self._idle.set()
        connection.close()

    def _process(self, batches: list[_Batch]) -> None:
        # Lines first (in order), then exits: an exit only ever follows its sandbox's lines.
        lines = [batch for batch in batches if not batch.is_exit]
        if lines:
            self._with_retries(self._store, lines)
        for batch in batches:
            if batch.is_exit:
                run = batch.sandbox.active
                if run is not None:  # taken once, before any retry of the exit
                    batch.effects = _sql_lines(run, run.sql_calls_unfinished())
                self._with_retries(self._exit, batch)

    def _with_retries(self, func: Any, arg: Any) -> None:
        """Run ``func(arg)``; on a lost database connection retry with backoff until it
        works (the queue holds the lines meanwhile, and reading waits when it is full: a
        batch is never dropped for an outage, since its effects, a run's end among them,
        would be lost with it). Other errors are logged and the batch is skipped; its events
        are in the live log, where the reaper finds them (``events_reconcile``)."""
        attempt = 0
        while True:
            try:
                func(arg)
                return
            except (OperationalError, InterfaceError) as exc:
                delay = RETRY_DELAYS[min(attempt, len(RETRY_DELAYS) - 1)]
                attempt += 1
                logger.warning(
                    "event pipeline: database error (%s); retrying in %.1f s", exc, delay
                )
                connection.close()
                time.sleep(delay)

    def _store(self, batches: list[_Batch]) -> None:
        """Store the batches' events and apply their effects, in one transaction."""
        live = live_log.enabled()
        by_conversation: dict[uuid.UUID, list[_Batch]] = defaultdict(list)
        for batch in batches:
            by_conversation[batch.sandbox.conversation_id].append(batch)
        with transaction.atomic():
            if live:
                # Before the effects' own messages (run.status …): on commit, in this order.
                for batch in batches:
                    if batch.held:
                        held, cid = batch.held, batch.sandbox.conversation_id
                        transaction.on_commit(
                            lambda cid=cid, held=held: event_services.events_publish(
                                conversation_id=cid, events=held
                            )
                        )
                gone = event_services.events_store(
                    events={
                        cid: [event for batch in group for event in batch.events or ()]
                        for cid, group in by_conversation.items()
                    }
                )
            else:
                gone = self._append(by_conversation)
            for conversation_id in gone:
                logger.info(
                    "conversation %s is gone; its sandbox's lines are dropped", conversation_id
                )
            kept = [b for b in batches if b.sandbox.conversation_id not in gone]
            # A statement sent is audited even when its conversation was deleted meanwhile.
            audited = [
                line for batch in batches if batch.sandbox.conversation_id in gone
                for line in batch.effects if line.kind is LineKind.SQL
            ]  # fmt: skip
            self._effects.apply([line for batch in kept for line in batch.effects] + audited)
            started = {b.sandbox.sandbox_id for b in kept if b.started}
            finished = {b.sandbox.sandbox_id for b in kept if b.finished}
            if started - finished:
                records.sandboxes_mark_busy(sandbox_ids=started - finished)
            if finished:
                records.sandboxes_mark_idle(sandbox_ids=finished)
            if not live:  # sent once committed
                transaction.on_commit(lambda: [self._sent(batch) for batch in kept])
        metrics.relay_stored(node=self.node, lines=sum(batch.lines for batch in kept))

    @staticmethod
    def _append(by_conversation: dict[uuid.UUID, list[_Batch]]) -> set[uuid.UUID]:
        """Embedded mode: store each conversation's drafts with new cursors (in
        conversation order, so two writers can never deadlock); the gone ones."""
        gone: set[uuid.UUID] = set()
        for conversation_id in sorted(by_conversation):
            drafts = [draft for batch in by_conversation[conversation_id] for draft in batch.drafts]
            try:
                event_services.events_append(
                    conversation_id=conversation_id, drafts=coalesce_deltas(drafts)
                )
            except ConversationGone:
                gone.add(conversation_id)
        return gone

    def _exit(self, batch: _Batch) -> None:
        """Record a sandbox's end and end its run, if one was still going."""
        sandbox = batch.sandbox
        tail = sandbox.stderr_tail()
        stopped = sandbox.stopping
        run = sandbox.active
        with transaction.atomic():
            records.sandbox_mark_exited(
                sandbox_id=sandbox.sandbox_id,
                stopped=stopped,
                exit_code=batch.exit_code,
                stderr_tail=tail,
            )
            self._effects.apply(batch.effects)  # the run's calls left without a result
            self._effects.sandbox_exited(
                run=run,
                conversation_id=sandbox.conversation_id,
                exit_code=batch.exit_code,
                stderr_tail=sandbox.mask_text(tail),
                expected=stopped,
            )
        if not stopped:
            metrics.sandbox_crashed(node=self.node)
        if run is not None:
            run.close()  # after commit: a retried transaction still finds the run
        for callback in self._on_exit:
            callback(sandbox)
