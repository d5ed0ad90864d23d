"""The run a sandbox executes, as its node knows it (:class:`ActiveRun`), the lines read for
it (:class:`ReadEntry`), and the error a sandbox raises (:class:`SandboxError`).

No import of the process (:mod:`sandboxes.process`) at run time: an :class:`ActiveRun`
holds its sandbox and calls it (``send``, ``kill``, ``kill_tools``), never builds one.
"""

from __future__ import annotations

import time
import uuid
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from conversations.services.run_effects import SqlCall
from sandboxes import protocol

if TYPE_CHECKING:
    from sandboxes.process import SandboxProcess

#: Seconds between two ``cancel`` ops for a run that was cancelled and has not ended yet.
CANCEL_RESEND_SECONDS = 1.0


class SandboxError(Exception):
    """A sandbox could not be started or used; ``code`` is the run error code to report."""

    def __init__(self, message: str, *, code: str = "sandbox") -> None:
        super().__init__(message)
        self.code = code


class ActiveRun:
    """The run a sandbox executes, as its node knows it: the one object that holds a run's
    state on the node (the domain sees it as a
    :class:`~conversations.services.run_effects.RunControl`).

    ``started``: ``time.monotonic()`` at submit; ``queued_at``: the run's creation (epoch
    seconds, for the time to first token), and ``first_token`` whether its first streamed
    text was stored. ``forced``: ``(code, message)`` once the
    host ended the run itself (timeout, budget, policy, a stop), and ``forced_at`` when.
    ``allowed_tools``: the only tools the run may use (None: any); ``gated`` whether its
    runtime asks before its risky tools act. ``usage``: the latest
    ``notify usage`` running totals as the runtime wrote them (``{"input", "output",
    "rounds", "estimated"}``, unchecked): what a run that ends without a result (crash,
    kill, lost stdout) is billed for.

    The run's ``run_sql`` calls are paired here, for the audit of data access, as the
    reader reads their lines (once each): a ``tool_calls`` line announces a call right
    before it runs (:meth:`sql_calls_announced`), its ``tool`` line ends it
    (:meth:`sql_call_ended`, in the same order: paw-agent runs a round's calls one by
    one), and the run's end leaves none waiting (:meth:`sql_calls_unfinished`).
    """

    def __init__(
        self,
        *,
        sandbox: SandboxProcess,
        run_id: uuid.UUID,
        user_id: int,
        queued_at: float | None = None,
        allowed_tools: frozenset[str] | None = None,
    ) -> None:
        self.sandbox = sandbox
        self.run_id = run_id
        self.user_id = user_id
        self.allowed_tools = allowed_tools
        self.started = time.monotonic()
        self.queued_at = queued_at
        self.first_token = False
        self.forced: tuple[str, str] | None = None
        self.forced_at: float | None = None
        self.cancel_sent_at: float | None = None
        self.cancel_resent_at: float | None = None
        self.usage: dict[str, Any] | None = None
        self._sql_waiting: deque[SqlCall] = deque()
        self._sql_count = 0

    @property
    def is_current(self) -> bool:
        """Whether this is still the run its sandbox executes."""
        return self.sandbox.active is self

    @property
    def gated(self) -> bool:
        """Whether the sandbox's runtime asks before its risky tools act (capability
        ``approval_gate``: :func:`~sandboxes.protocol.runtime_gated`); an ungated one
        (python-agent-harness) has run a call by the time the host hears of it."""
        return protocol.runtime_gated(self.sandbox.capabilities)

    def record_usage(self, data: Any) -> None:
        """Keep the runtime's latest running totals (a ``notify usage`` line's ``data``)."""
        if isinstance(data, dict):
            self.usage = dict(data)

    def sql_calls_announced(self, calls: Any) -> None:
        """Note the ``run_sql`` calls of a ``tool_calls`` line's ``data`` (masked): each
        gets the next ordinal of the run and the time now, and waits for its ``tool``
        line."""
        if not isinstance(calls, list):
            return
        for call in calls:
            if isinstance(call, dict) and call.get("name") == "run_sql":
                self._sql_count += 1
                self._sql_waiting.append(
                    SqlCall(
                        ordinal=self._sql_count,
                        conversation_id=self.sandbox.conversation_id,
                        call=call,
                        at=timezone.now(),
                    )
                )

    def sql_call_ended(self, data: Any) -> SqlCall | None:
        """The announced ``run_sql`` call a ``tool`` line's ``data`` (masked) ends, with it
        as its ``result``: the oldest one waiting. ``None`` for another tool, or when none
        waits (a call refused before it was announced)."""
        if not isinstance(data, dict) or data.get("name") != "run_sql" or not self._sql_waiting:
            return None
        return replace(self._sql_waiting.popleft(), result=data)

    def sql_calls_unfinished(self) -> list[SqlCall]:
        """The announced ``run_sql`` calls that got no ``tool`` line (the run ended
        meanwhile: a cancel, a crash), in order; none waits afterwards."""
        waiting = list(self._sql_waiting)
        self._sql_waiting.clear()
        return waiting

    def mark_forced(self, *, code: str, message: str) -> bool:
        """Record that the host ends the run (``code``, ``message``: its error) without
        telling the runtime (the caller stops the sandbox). ``False`` when the run already
        ended or was already forced: the first reason stays."""
        if not self.is_current or self.forced is not None:
            return False
        self.forced = (code, message)
        self.forced_at = time.monotonic()
        return True

    def force_end(self, *, code: str, message: str) -> None:
        """End the run for a host reason (timeout, budget, policy): a ``cancel`` op now,
        and the run ends ``error`` with ``code`` when its cancelled result arrives. The
        node's monitor kills the sandbox if the runtime does not comply within
        ``PAW_RUN_CANCEL_GRACE_SECONDS``."""
        if not self.mark_forced(code=code, message=message):
            return
        try:
            self.sandbox.send("cancel", run_id=str(self.run_id))
        except SandboxError:
            self.sandbox.kill()

    def cancel(self) -> None:
        """Write a ``cancel`` op for this run (somebody cancelled it). The first one is
        remembered (``cancel_sent_at``): until the run ends, the node's monitor writes it
        again every ``CANCEL_RESEND_SECONDS`` (a runtime that missed it, say while it was
        still setting the run up, gets it again) and kills the sandbox if the run is still
        going ``PAW_RUN_CANCEL_GRACE_SECONDS`` later. A sandbox that is gone is killed
        (its exit ends the run)."""
        if not self.is_current:
            return
        now = time.monotonic()
        if self.cancel_sent_at is None:
            self.cancel_sent_at = now
        self.cancel_resent_at = now
        try:
            op_id = self.sandbox.send("cancel", run_id=str(self.run_id))
        except SandboxError:
            self.sandbox.kill()
            return
        # A runtime that ended the run meanwhile refuses it ("not active"): not news.
        self.sandbox.quiet_refusals(op_id)

    def answer(self, *, answers: list[str], ask_id: str | None) -> None:
        """Write an ``answer`` op for this run. Raises :class:`SandboxError` when the
        sandbox is gone."""
        self.sandbox.send("answer", run_id=str(self.run_id), answers=answers, ask_id=ask_id)

    def close(self) -> None:
        """The run ended in its sandbox (its ``result`` was read, or the process exited).
        A run that was cancelled (somebody's cancel, or the host's: timeout, budget,
        policy) leaves no tool process behind: paw-agent kills its own; for any other
        runtime the host kills every process of the sandbox but the runtime
        (:meth:`SandboxProcess.kill_tools`)."""
        if self.sandbox.active is self:
            self.sandbox.active = None
            self.sandbox.last_run = self
            stopped = self.cancel_sent_at is not None or self.forced is not None
            if stopped and self.sandbox.kind != "paw-agent":
                self.sandbox.kill_tools()


@dataclass
class ReadEntry:
    """One line read from a runtime, tagged with the run it belongs to (as the host knows
    it: the runtime's own ``run_id`` is never trusted for attribution)."""

    run: ActiveRun | None
    line: protocol.ParsedLine

    @property
    def run_id(self) -> uuid.UUID | None:
        return self.run.run_id if self.run is not None else None
