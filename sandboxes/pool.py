"""The sandbox pool: the runtime processes a worker node owns, one per conversation.

Lives in the Celery worker process (a module-level singleton, :func:`get_pool`). One
thread of the process (:class:`OutputReader`) reads every sandbox's stdout and turns it
into parsed lines for the node's :class:`~sandboxes.pipeline.EventPipeline`; each
:class:`SandboxProcess` has one thread keeping the tail of its stderr. Ops are written
under a lock, one JSON line each. Celery task threads only spawn, submit and write ops:
they never wait for a run to finish.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings

from sandboxes import protocol
from sandboxes.launch import (
    KEEPER,
    SandboxSpec,
    build_command,
    build_environment,
    handover_variables,
    isolation_mode,
    network_mode,
    private_variables,
    runtime_answer_timeout,
    runtime_kind,
    takes_secrets_fd,
)
from sandboxes.network import NetworkPlan, SandboxNetwork, network_plan, spare_plan
from secrets_vault.masking import StreamMasker, mask_secrets

logger = logging.getLogger(__name__)

STDERR_TAIL_LINES = 40
#: Longest stdout line accepted (bytes); a longer one is cut and kept as malformed.
MAX_LINE_BYTES = 4 * 1024 * 1024
#: Seconds to wait for the runtime to acknowledge a submit (``start``) or refuse it.
SUBMIT_ACK_TIMEOUT = 10.0
#: Seconds between two ``cancel`` ops for a run that was cancelled and has not ended yet.
CANCEL_RESEND_SECONDS = 1.0
#: Seconds the keeper gets to kill a sandbox's processes on SIGUSR1 (it takes milliseconds).
KEEPER_KILL_SECONDS = 2.0
#: PROTOCOL.md: ``result`` is written a moment before the next submit is accepted.
SUBMIT_RETRY_DELAY = 0.05
#: Seconds a spare gets to take its hand-over (the op is answered at once).
HANDOVER_TIMEOUT = 10.0


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


@dataclass
class _Waiter:
    event: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class SandboxProcess:
    """One runtime process: spawn, handshake, ops, reading, stopping.

    ``sandbox_id`` is the ``Sandbox`` row's id; ``active`` the run being executed (an
    :class:`ActiveRun`, set before its submit is written, closed when its ``result`` is
    read or the process exits); ``last_run`` the one before.

    ``spare``: a paw-agent started before any conversation needs it (``sandboxes/
    spares.py``): ``spec`` is then the spare's own (its folder, no variables), its network
    allows nothing, its secrets pipe stays open, and :meth:`hand_over` later makes it a
    conversation's sandbox, once.
    """

    def __init__(
        self,
        *,
        sandbox_id: uuid.UUID,
        spec: SandboxSpec,
        sink: Callable[..., None],
        on_network_refused: Callable[[SandboxProcess, str, str], None] | None = None,
        spare: bool = False,
    ) -> None:
        self.sandbox_id = sandbox_id
        self.spare = spare
        #: The folder the runtime was started in (a spare's stays its path in the jail).
        self.started_in = spec.workspace
        self._secrets_writer: int | None = None  # a spare's, written at its hand-over
        self._start_lock = threading.Lock()
        #: The node-side forwarder of an isolated network (``PAW_SANDBOX_NETWORK``).
        self.network: SandboxNetwork | None = None
        self._on_network_refused = on_network_refused
        #: Runs already told about a refused destination (one ``notice`` per run).
        self.network_noticed: set[uuid.UUID | None] = set()
        self.spec = spec
        self.conversation_id = uuid.UUID(spec.conversation_id)
        self.fingerprint = spec.fingerprint
        self._sink = sink
        self.process: subprocess.Popen | None = None
        self.command: list[str] = []
        self.capabilities: frozenset[str] = frozenset()
        self.active: ActiveRun | None = None
        self.last_run: ActiveRun | None = None
        #: The host's notices for the next run, stored right after its ``start`` line.
        self.start_notices: list[protocol.HostNotice] = []
        self.last_active = time.monotonic()
        self.stopping = False
        self._stream_masker: StreamMasker | None = None
        self._ready = threading.Event()
        self._ready_error: str | None = None
        self._write_lock = threading.Lock()
        self._waiters: dict[str, _Waiter] = {}
        self._quiet: collections.deque[str] = collections.deque(maxlen=64)
        self._submit_waiters: dict[str, _Waiter] = {}
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._seq = protocol.SeqTracker()
        self._threads: list[threading.Thread] = []
        self.exited = threading.Event()
        # Reading stdout (see OutputReader): what is left of a line, and whether a line
        # over MAX_LINE_BYTES is being dropped up to its newline.
        self._pending = b""
        self._discarding = False
        self._eof_thread: threading.Thread | None = None
        self._eof_done = threading.Event()  # the exit was handed to the sink
        self.kind = "other"  # runtime_kind() of the command, once started

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> None:
        """Start the process and its reader threads (returns at once; see ``wait_ready``).
        A sandbox stopped before it started is not started."""
        with self._start_lock:
            if self.stopping:
                return
            self._start()

    def _start(self) -> None:
        env = build_environment(self.spec, sandbox_id=str(self.sandbox_id))
        secrets_fd, private = None, {}
        if takes_secrets_fd():
            private = private_variables(env)
            for name in private:
                del env[name]
            secrets_fd, writer = os.pipe()
        elif self.spare:
            raise SandboxError("only paw-agent can be a spare", code="sandbox_start")
        plan, folder = None, None
        if network_mode() == "isolated":
            plan = spare_plan() if self.spare else network_plan({**env, **private})
            for name, value in plan.env.items():
                (private if name in private else env)[name] = value
            self.network = SandboxNetwork(plan, self._network_refused)
            folder = self.network.start()
        # Under bubblewrap the protocol pipes go in above descriptor 2, so that the jail's
        # init (readable by the sandbox's code) never holds them (launch.stdio_prefix).
        ops_reader = ops_writer = lines_reader = lines_writer = None
        if isolation_mode() == "bwrap":
            ops_reader, ops_writer = os.pipe()
            lines_reader, lines_writer = os.pipe()
        jail_ends = tuple(fd for fd in (ops_reader, lines_writer) if fd is not None)
        self.command = build_command(
            self.spec, secrets_fd=secrets_fd, network=plan, network_folder=folder,
            stdio_fds=jail_ends or None, spare=self.spare,
        )  # fmt: skip
        self.kind = runtime_kind()
        try:
            self.process = launch(
                self.command,
                stdin=subprocess.DEVNULL if jail_ends else subprocess.PIPE,
                stdout=subprocess.DEVNULL if jail_ends else subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.spec.workspace,
                env=env,
                start_new_session=True,  # its own process group: we can signal all of it
                bufsize=0,
                pass_fds=(*((secrets_fd,) if secrets_fd is not None else ()), *jail_ends),
            )
        except BaseException:
            if self.network is not None:
                self.network.close()
            for fd in (ops_writer, lines_reader, writer if secrets_fd is not None else None):
                if fd is not None:
                    os.close(fd)
            raise
        finally:
            if secrets_fd is not None:
                os.close(secrets_fd)
            for fd in jail_ends:
                os.close(fd)
        if jail_ends:  # the host's ends, as Popen would have made them (unbuffered)
            self.process.stdin = open(ops_writer, "wb", buffering=0)  # noqa: SIM115
            self.process.stdout = open(lines_reader, "rb", buffering=0)  # noqa: SIM115
        if secrets_fd is not None and self.spare:
            self._secrets_writer = writer  # a spare learns its variables at its hand-over
        elif secrets_fd is not None:
            # Written from a thread: a pipe holds 64 KiB, and the runtime reads it at start.
            threading.Thread(
                target=_write_and_close, args=(writer, json.dumps(private).encode()), daemon=True
            ).start()
        thread = threading.Thread(
            target=self._read_stderr, name=f"sandbox-err-{self.conversation_id}", daemon=True
        )
        thread.start()
        self._threads.append(thread)
        output_reader().add(self)

    def hand_over(
        self,
        spec: SandboxSpec,
        *,
        sink: Callable[..., None],
        on_network_refused: Callable[[SandboxProcess, str, str], None] | None,
        plan: NetworkPlan | None = None,
    ) -> None:
        """Make this spare (ready) the sandbox of ``spec``'s conversation, whose workspace
        its folder has just become: from now on its lines go to ``sink`` and its refused
        destinations to ``on_network_refused``; its forwarder follows ``plan`` (the
        run's :func:`~sandboxes.network.network_plan`, required with an isolated
        network); the runtime reads ``spec``'s variables from its secrets pipe (never its
        argv or environment) and takes the workspace (``handover`` op), which a ``ping``
        confirms. Raises :class:`SandboxError` when the runtime refuses, exits or does not
        answer within ``HANDOVER_TIMEOUT`` seconds (the caller kills it)."""
        writer, self._secrets_writer = self._secrets_writer, None
        if not self.spare or writer is None:
            raise SandboxError("this sandbox is no spare", code="sandbox")
        self.spare = False
        # Without a jail the runtime sees the renamed folder; in one, the path it was
        # bound at.
        seen_as = spec.workspace if self.kept else self.started_in
        variables = handover_variables(spec, seen_as=seen_as)
        if self.network is not None:
            if plan is None:
                raise SandboxError("a spare's hand-over needs its network plan", code="sandbox")
            variables.update(plan.env)
            self.network.plan = plan
        self.spec = spec
        self.conversation_id = uuid.UUID(spec.conversation_id)
        self.fingerprint = spec.fingerprint
        self._on_network_refused = on_network_refused
        self._sink = sink
        threading.Thread(
            target=_write_and_close, args=(writer, json.dumps(variables).encode()), daemon=True
        ).start()
        handover, ping = _Waiter(), _Waiter()
        handover_id, ping_id = protocol.new_op_id("handover"), protocol.new_op_id("ping")
        self._waiters.update({handover_id: handover, ping_id: ping})
        self.quiet_refusals(handover_id)  # a refusal fails the hand-over; it is no event
        try:
            self.send(
                "handover",
                op_id=handover_id,
                project=str(seen_as),
                answer_timeout=runtime_answer_timeout(spec),
            )
            self.send("ping", op_id=ping_id)  # answered once the hand-over is done
            if not ping.event.wait(HANDOVER_TIMEOUT) and not self.exited.is_set():
                raise SandboxError("the spare did not take its hand-over", code="sandbox")
        finally:
            self._waiters.pop(handover_id, None)
            self._waiters.pop(ping_id, None)
        if handover.error is not None:
            raise SandboxError(f"the spare refused its hand-over: {handover.error}")
        if self.exited.is_set():
            raise SandboxError("the spare exited at its hand-over", code="sandbox_exited")

    def open_package_index(self) -> bool:
        """Allow the package index (an approved ``install_package`` is about to run) until
        the run's next tool result or its end. Returns whether the sandbox has an isolated
        network (with ``host`` there is nothing to open)."""
        if self.network is None:
            return False
        self.network.index_open = True
        logger.info("sandbox %s: the package index is open for an install", self.sandbox_id)
        return True

    def _close_index_after_install(self, entries: list[ReadEntry]) -> None:
        for entry in entries:
            line = entry.line
            if isinstance(line, protocol.RunLine) and (
                line.type == "result" or (line.type == "notify" and line.kind == "tool")
            ):
                self.network.index_open = False
                logger.info("sandbox %s: the package index is closed", self.sandbox_id)
                return

    def _network_refused(self, destination: str, reason: str) -> None:
        """The forwarder refused ``destination``: logged with the run it happened in, and
        passed to ``on_network_refused`` (the node's notice, once per run)."""
        run = self.active or self.last_run
        run_id = run.run_id if run is not None else None
        logger.warning(
            "sandbox %s run %s: network destination refused: %s", self.sandbox_id, run_id, reason
        )
        if self._on_network_refused is not None:
            try:
                self._on_network_refused(self, destination, reason)
            except Exception:
                logger.exception("sandbox %s: the refusal could not be reported", self.sandbox_id)

    def wait_ready(self, timeout: float) -> None:
        """Wait for ``ready`` (and accept its protocol version) or raise :class:`SandboxError`."""
        if not self._ready.wait(timeout):
            raise SandboxError(
                f"the agent runtime did not start within {timeout:g} s"
                + (f": {self.stderr_tail()[-500:]}" if self.stderr_tail() else ""),
                code="sandbox_start",
            )
        if self._ready_error:
            raise SandboxError(self._ready_error, code="sandbox_start")

    def stderr_tail(self) -> str:
        """The last lines the runtime wrote to stderr, with the sandbox's secret values
        masked (each line as it arrived, before it was cut to 2000 characters, and the
        whole tail again, for a value spread over lines): what is stored on the
        ``Sandbox`` row, shown in the admin and put in a run's error message."""
        return self.mask_text("\n".join(self._stderr))

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def state(self) -> str:
        """``starting``, ``idle``, ``busy`` or ``stopping`` (as :meth:`SandboxPool.state_counts`
        counts it)."""
        if self.stopping:
            return "stopping"
        if not self._ready.is_set():
            return "starting"
        return "busy" if self.active is not None else "idle"

    def stop(self, *, grace: float = 3.0) -> None:
        """Stop the process: ``shutdown`` op, then SIGTERM, then SIGKILL of its process
        group; finally every process still carrying this sandbox's marker is killed (tools
        that moved to another process group). Never raises."""
        with self._start_lock:  # a sandbox stopped while it starts: after its start
            self.stopping = True
            process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(SandboxError):
                self.send("shutdown")
            self._wait(process, grace)
        if process.poll() is None:
            self._signal_group(signal.SIGTERM)
            self._wait(process, grace)
        self._kill_tree()
        self._wait(process, grace)
        kill_marked_processes(str(self.sandbox_id))
        with contextlib.suppress(OSError):
            process.stdin.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=grace)
        if threading.current_thread() is not self._eof_thread:
            self._eof_done.wait(timeout=grace)

    def kill(self) -> None:
        """Kill the whole sandbox at once (no grace)."""
        with self._start_lock:
            self.stopping = True
        self._kill_tree()
        kill_marked_processes(str(self.sandbox_id))

    def tool_processes(self) -> list[int]:
        """The pids of every process of the sandbox but its own machinery (the keeper, or
        bubblewrap and the init of its PID namespace) and the runtime itself: what its
        tools started, detached ones included (re-parented to the keeper or to the
        namespace's init, so still below the sandbox's root). The runtime is the root's
        oldest child (with an isolated network, the relay's: ``sandboxes/jail_relay.py``
        starts the runtime)."""
        if self.process is None or self.process.poll() is not None:
            return []
        table = _process_table()
        children: dict[int, list[int]] = collections.defaultdict(list)
        for pid, (parent, _, _) in table.items():
            children[parent].append(pid)

        def oldest(pids: list[int]) -> int | None:
            return min(pids, key=lambda pid: table[pid][2]) if pids else None

        root: int | None = self.process.pid
        if not self.kept:  # bwrap → the namespace's init (bwrap again) → the runtime
            root = oldest(children[root])
        runtime = oldest(children[root]) if root is not None else None
        if runtime is None:
            return []
        stack = [pid for pid in children[root] if pid != runtime]
        if self.network is not None:  # an isolated network: init → the relay → the runtime
            relay, runtime = runtime, oldest(children[runtime])
            if runtime is None:
                return []
            stack += [pid for pid in children[relay] if pid != runtime]
        found: list[int] = []
        stack += children[runtime]
        while stack:
            pid = stack.pop()
            if table[pid][1] != "Z":
                found.append(pid)
            stack.extend(children[pid])
        return found

    def kill_tools(self, *, rounds: int = 50) -> int:
        """SIGKILL :meth:`tool_processes` until none is left (one forked meanwhile is
        found in the next round); the runtime stays up. Returns how many kills were sent."""
        sent = 0
        for _ in range(rounds):
            found = self.tool_processes()
            if not found:
                break
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
                    sent += 1
            time.sleep(0.005)
        if sent:
            logger.info(
                "sandbox %s: killed %d tool process(es) of a stopped run", self.sandbox_id, sent
            )
        return sent

    @property
    def kept(self) -> bool:
        """Whether the sandbox runs under the keeper (``PAW_SANDBOX_ISOLATION=none``)."""
        return KEEPER in self.command

    def _kill_tree(self) -> None:
        """SIGKILL every process of the sandbox. Under the keeper: SIGUSR1 first, so the
        keeper kills all its descendants (those in sessions of their own too) before it
        dies, then SIGKILL of the group for what is left. With bubblewrap, the SIGKILL of
        the group ends bwrap, and with it the sandbox's PID namespace: every process in
        it."""
        process = self.process
        if process is None:
            return
        if self.kept and process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process.pid, signal.SIGUSR1)
            self._wait(process, KEEPER_KILL_SECONDS)
        self._signal_group(signal.SIGKILL)

    @staticmethod
    def _wait(process: subprocess.Popen, timeout: float) -> None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=timeout)

    def _signal_group(self, signum: int) -> None:
        if self.process is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    # --- masking ------------------------------------------------------------------------

    def mask(self, payload: dict[str, Any]) -> dict[str, Any]:
        """``payload`` with every secret value given to this sandbox replaced by
        ``[secret:NAME]`` (what PAW stores and sends). Streamed text (``delta``) goes
        through one :class:`StreamMasker` per run, so a value split across two deltas is
        masked too; the piece it holds back comes out in a later delta or at the end
        (:meth:`flush_stream`)."""
        values = self.spec.secret_values
        if not values:
            return payload
        if payload.get("type") == "delta" and isinstance(payload.get("text"), str):
            if self._stream_masker is None:
                self._stream_masker = StreamMasker(values)
            rest = mask_secrets({k: v for k, v in payload.items() if k != "text"}, values)
            return {**rest, "text": self._stream_masker.feed(payload["text"])}
        return mask_secrets(payload, values)

    def flush_stream(self) -> str:
        """Streamed text the masker still holds (call at the run's end), masked."""
        masker, self._stream_masker = self._stream_masker, None
        return masker.flush() if masker is not None else ""

    def mask_text(self, text: str) -> str:
        """``text`` with the sandbox's secret values masked."""
        return mask_secrets(text, self.spec.secret_values) if self.spec.secret_values else text

    # --- ops ----------------------------------------------------------------------------

    def send(self, op: str, *, op_id: str | None = None, **fields: Any) -> str:
        """Write one op (with ``op_id``, else a fresh one); returns the op_id.

        Raises :class:`SandboxError` when the process is gone.
        """
        op_id = op_id or protocol.new_op_id(op)
        data = protocol.encode_op(op, op_id=op_id, **fields)
        with self._write_lock:
            if self.process is None or self.process.stdin is None:
                raise SandboxError("the sandbox is not running", code="sandbox_exited")
            try:
                self.process.stdin.write(data)
            except (BrokenPipeError, ValueError, OSError) as exc:
                raise SandboxError(
                    f"the sandbox stopped accepting ops ({exc})", code="sandbox_exited"
                ) from exc
        self.last_active = time.monotonic()
        return op_id

    def quiet_refusals(self, op_id: str) -> None:
        """An ``error`` line answering op ``op_id`` is dropped, not stored (the op was a
        repeated ``cancel``, which a runtime that already ended the run refuses)."""
        self._quiet.append(op_id)

    @property
    def current_run(self) -> uuid.UUID | None:
        """The id of the run being executed, if any."""
        return self.active.run_id if self.active is not None else None

    def run_of(self, run_id: uuid.UUID) -> ActiveRun | None:
        """This sandbox's current or previous run with id ``run_id``, if it is one of them."""
        for run in (self.active, self.last_run):
            if run is not None and run.run_id == run_id:
                return run
        return None

    def submit(
        self,
        *,
        run_id: uuid.UUID,
        user_id: int,
        prompt: str,
        queued_at: float | None = None,
        tools: list[str] | None = None,
        knowledge: dict[str, Any] | None = None,
        attachments: list[dict[str, str]] | None = None,
        vision: bool | None = None,
    ) -> None:
        """Submit a run (of the user ``user_id``, created at ``queued_at``, epoch seconds)
        and wait until the runtime acknowledges it with ``start``. ``tools`` (the only
        tools the run may use), ``knowledge``, ``attachments`` (``[{"path"}]``, images
        sent with the prompt) and ``vision`` (the model accepts images) travel in the
        submit op (paw-agent's ``submit_tools``, ``knowledge`` and ``images``
        capabilities; None leaves them out).

        A refusal because a run is still active is retried once after ~50 ms
        (PROTOCOL.md). Raises :class:`SandboxError` when the runtime refuses, exits, or
        does not answer within ``SUBMIT_ACK_TIMEOUT`` seconds.
        """
        active = self.active = ActiveRun(
            sandbox=self,
            run_id=run_id,
            user_id=user_id,
            queued_at=queued_at,
            allowed_tools=frozenset(tools) if tools is not None else None,
        )
        for attempt in (1, 2):
            waiter = _Waiter()
            self._submit_waiters[str(run_id)] = waiter
            op_id = self.send(
                "submit",
                prompt=prompt,
                run_id=str(run_id),
                tools=tools,
                knowledge=knowledge,
                attachments=attachments,
                vision=vision,
            )
            self._waiters[op_id] = waiter
            try:
                if not waiter.event.wait(SUBMIT_ACK_TIMEOUT) and not self.exited.is_set():
                    raise SandboxError(
                        "the agent runtime did not acknowledge the run", code="sandbox"
                    )
            finally:
                self._waiters.pop(op_id, None)
                self._submit_waiters.pop(str(run_id), None)
            if self.exited.is_set() and not waiter.event.is_set():
                raise SandboxError(
                    "the sandbox exited before the run started", code="sandbox_exited"
                )
            if waiter.error is None:
                return
            if attempt == 1 and "already active" in waiter.error:
                time.sleep(SUBMIT_RETRY_DELAY)
                continue
            if self.active is active:
                self.active = None
            raise SandboxError(f"the agent runtime refused the run: {waiter.error}", code="sandbox")

    # --- reading ------------------------------------------------------------------------

    def _read_available(self, fd: int) -> list[ReadEntry] | None:
        """Read what stdout holds now (one read; called when it is readable) and turn its
        whole lines into entries for the pipeline; ``None`` at its end (the rest of a last
        line without a newline is taken then too, through the sink)."""
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return []
        except OSError:
            chunk = b""
        if not chunk:
            if self._pending.strip() and not self._discarding:
                entries = list(self._take(self._pending))
                if entries:
                    self._sink(self, entries)
            self._pending = b""
            return None
        *lines, self._pending = (self._pending + chunk).split(b"\n")
        if self._discarding:
            if not lines:
                self._pending = b""
                return []
            lines = lines[1:]
            self._discarding = False
        if len(self._pending) > MAX_LINE_BYTES:
            # Not a protocol line: keep its start as a malformed line, drop the rest.
            lines.append(self._pending[:4000] + b" [cut]")
            self._pending = b""
            self._discarding = True
        entries = [entry for raw in lines if raw.strip() for entry in self._take(raw)]
        if self.network is not None and self.network.index_open:
            self._close_index_after_install(entries)
        if entries:
            self.last_active = time.monotonic()
        return entries

    def _ended(self) -> None:
        """Stdout ended (or could not be read): record the exit, on a thread of its own
        (it waits for the process)."""
        self._eof_thread = threading.Thread(
            target=self._on_eof, name=f"sandbox-exit-{self.conversation_id}", daemon=True
        )
        self._eof_thread.start()

    def _take(self, raw: bytes) -> list[ReadEntry]:
        """Handle control lines here; return what the pipeline must store."""
        line = protocol.parse_line(raw)
        if isinstance(line, protocol.Ready):
            if not self._ready.is_set():
                try:
                    protocol.check_handshake(line)
                except protocol.ProtocolMismatch as exc:
                    self._ready_error = str(exc)
                self.capabilities = frozenset(line.capabilities)
                self._ready.set()
            return []
        if isinstance(line, protocol.ControlLine):
            waiter = self._waiters.get(line.op_id or "")
            if line.type == "error":
                if waiter is not None:
                    waiter.error = self.mask_text(line.message or line.error_code or "refused")
                    waiter.event.set()
                if line.op_id and line.op_id in self._quiet:
                    return []
                return [ReadEntry(run=self.active, line=line)]
            if line.type == "pong" and waiter is not None:
                waiter.event.set()
            return []  # pong, hello: answers to our own probes
        run = self.active
        run_id = run.run_id if run is not None else None
        entries = [ReadEntry(run=run, line=line)]
        if isinstance(line, protocol.RunLine):
            if line.type == "start":
                self._seq = protocol.SeqTracker()
                waiter = self._submit_waiters.get(line.run_id)
                if waiter is not None:
                    waiter.event.set()
            problem = self._seq.observe(line.seq)
            if run_id is not None and line.run_id and line.run_id != str(run_id):
                foreign = self.mask_text(line.run_id)[:64]  # masked whole, then cut
                problem = f"a line for run {foreign!r} arrived during run {run_id}"
            if problem:
                entries.append(ReadEntry(run=run, line=protocol.Anomaly(f"protocol: {problem}")))
            if line.type == "start" and run is not None and self.start_notices:
                notices, self.start_notices = self.start_notices, []
                entries += [ReadEntry(run=run, line=notice) for notice in notices]
            if line.type == "result" and run is not None:
                run.close()  # the runtime takes the next submit now (PROTOCOL.md)
        return entries

    def _read_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        for raw in iter(self.process.stderr.readline, b""):
            text = raw.decode("utf-8", errors="replace").rstrip()
            if text:
                self._stderr.append(self.mask_text(text)[:2000])

    def _on_eof(self) -> None:
        assert self.process is not None
        try:
            returncode = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._kill_tree()
            returncode = self.process.wait()
        kill_marked_processes(str(self.sandbox_id))
        if self.network is not None:
            self.network.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=2)
        self.exited.set()
        self._ready.set()
        if self._ready_error is None and not self.capabilities:
            self._ready_error = f"the agent runtime exited (code {returncode}) before it was ready"
        for waiter in list(self._waiters.values()):
            waiter.event.set()
        try:
            self._sink(self, None, returncode=returncode)
        finally:
            self._eof_done.set()


class OutputReader:
    """One thread reading the stdout of every sandbox of this process (``selectors``).

    Each round takes what every readable pipe holds (one read each), turns it into
    entries, and hands them to the sandboxes' sinks together: a sink that is a bound
    method of an object with ``submit_many`` (the node's
    :class:`~sandboxes.pipeline.EventPipeline`) gets the round's reads of all its
    sandboxes in one call (they go live in one round trip to Redis); others get each
    sandbox's own. A quiet pipe is read the moment it has a line; when many sandboxes
    write at once, each round takes more of each, so reads, events and their relays grow
    fewer and larger instead of a hundred threads waking for every line (issue 16). A
    stdout that ends is handed to a thread of its own to record the exit
    (:meth:`SandboxProcess._ended`)."""

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._added: collections.deque[SandboxProcess] = collections.deque()
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._selector.register(self._wake_read, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._loop, name="sandbox-output", daemon=True)
        self._thread.start()

    def add(self, sandbox: SandboxProcess) -> None:
        """Read ``sandbox``'s stdout from now on, until it ends."""
        self._added.append(sandbox)
        with contextlib.suppress(BlockingIOError):
            os.write(self._wake_write, b"x")

    def _loop(self) -> None:
        while True:
            ready: list[tuple[SandboxProcess, list[ReadEntry]]] = []
            for key, _ in self._selector.select():
                sandbox = key.data
                if sandbox is None:
                    self._take_added()
                    continue
                try:
                    entries = sandbox._read_available(key.fd)
                except Exception:
                    logger.exception("sandbox %s: reader failed", sandbox.sandbox_id)
                    entries = None
                if entries is None:
                    self._selector.unregister(key.fd)
                    sandbox._ended()
                elif entries:
                    ready.append((sandbox, entries))
            if ready:
                self._deliver(ready)

    def _take_added(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while os.read(self._wake_read, 4096):
                pass
        while self._added:
            sandbox = self._added.popleft()
            stdout = sandbox.process.stdout if sandbox.process is not None else None
            if stdout is None:
                continue
            os.set_blocking(stdout.fileno(), False)
            self._selector.register(stdout.fileno(), selectors.EVENT_READ, sandbox)

    @staticmethod
    def _deliver(ready: list[tuple[SandboxProcess, list[ReadEntry]]]) -> None:
        batched: dict[int, tuple[Any, list[tuple[SandboxProcess, list[ReadEntry]]]]] = {}
        for sandbox, entries in ready:
            sink = sandbox._sink
            owner = getattr(sink, "__self__", None)
            submit_many = getattr(owner, "submit_many", None)
            if submit_many is None:
                try:
                    sink(sandbox, entries)
                except Exception:
                    logger.exception("sandbox %s: its lines were not taken", sandbox.sandbox_id)
                continue
            batched.setdefault(id(owner), (submit_many, []))[1].append((sandbox, entries))
        for submit_many, items in batched.values():
            try:
                submit_many(items)
            except Exception:
                logger.exception("event pipeline: %d read(s) were not taken", len(items))


_output_reader: OutputReader | None = None
_output_reader_lock = threading.Lock()


def output_reader() -> OutputReader:
    """This process's :class:`OutputReader` (started on first use)."""
    global _output_reader
    with _output_reader_lock:
        if _output_reader is None:
            _output_reader = OutputReader()
        return _output_reader


_launcher: concurrent.futures.ThreadPoolExecutor | None = None
_launcher_lock = threading.Lock()


def _write_and_close(fd: int, data: bytes) -> None:
    """Write ``data`` to the pipe ``fd`` and close it (its reader sees the end)."""
    try:
        with os.fdopen(fd, "wb") as pipe:
            pipe.write(data)
    except OSError:
        pass  # the runtime died before reading: its exit is reported elsewhere


def launch(command: list[str], **popen_kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen`` from one long-lived thread of this process.

    bubblewrap's ``--die-with-parent`` (Linux ``PR_SET_PDEATHSIG``) kills the sandbox when
    the *thread* that started it ends. Celery's pool threads end when the worker shuts
    down, before PAW can stop its sandboxes in order; the launcher thread lives as long
    as the process, so a sandbox dies with the worker process, not with a task thread.
    """
    global _launcher
    with _launcher_lock:
        if _launcher is None:
            _launcher = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="sandbox-launcher"
            )
    return _launcher.submit(subprocess.Popen, command, **popen_kwargs).result()


def _process_table() -> dict[int, tuple[int, str, int]]:
    """``{pid: (parent pid, state letter, start time in clock ticks)}`` from ``/proc``."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            table[int(name)] = (int(fields[1]), fields[0].decode(), int(fields[19]))
        except (OSError, IndexError, ValueError):
            continue
    return table


def kill_marked_processes(marker: str) -> int:
    """SIGKILL every process whose environment carries ``PAW_SANDBOX_ID=<marker>``.

    Catches what a process group kill misses (a tool that started its own session).
    Returns how many were killed. Linux only (reads ``/proc/<pid>/environ``).
    """
    needle = f"PAW_SANDBOX_ID={marker}".encode()
    killed = 0
    own = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        try:
            environ = (entry / "environ").read_bytes()
        except OSError:
            continue
        if needle in environ.split(b"\0"):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
    return killed


class SandboxPool:
    """The live sandboxes of this node, by conversation id, and its spares.

    Room: ``occupied()`` counts every runtime process the node has or is about to have —
    the conversations' sandboxes, the spares (starting or ready) and the slots reserved
    for a sandbox being spawned or handed over — which ``PAW_MAX_SANDBOXES_PER_NODE``
    bounds. Decisions about room are taken under ``capacity`` (one at a time per node).
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._sandboxes: dict[uuid.UUID, SandboxProcess] = {}
        self._spares: list[SandboxProcess] = []
        self._reserved = 0
        #: Held while deciding whether one more process fits (``sandboxes.services``).
        self.capacity = threading.Lock()
        # One spawn at a time per conversation.
        self._conversation_locks: dict[uuid.UUID, threading.Lock] = collections.defaultdict(
            threading.Lock
        )

    def conversation_lock(self, conversation_id: uuid.UUID) -> threading.Lock:
        with self._lock:
            return self._conversation_locks[conversation_id]

    def get(self, conversation_id: uuid.UUID) -> SandboxProcess | None:
        with self._lock:
            sandbox = self._sandboxes.get(conversation_id)
        return sandbox if sandbox is not None and sandbox.alive() and not sandbox.stopping else None

    def add(self, sandbox: SandboxProcess, *, reserved: bool = False) -> None:
        """Count ``sandbox`` as its conversation's; ``reserved``: it takes the slot
        :meth:`reserve` (or :meth:`spare_take`) held for it."""
        with self._lock:
            self._sandboxes[sandbox.conversation_id] = sandbox
            if reserved:
                self._reserved -= 1

    def discard(self, sandbox: SandboxProcess) -> None:
        with self._lock:
            if self._sandboxes.get(sandbox.conversation_id) is sandbox:
                del self._sandboxes[sandbox.conversation_id]

    def all(self) -> list[SandboxProcess]:
        """The conversations' sandboxes (not the spares)."""
        with self._lock:
            return list(self._sandboxes.values())

    def idle_lru(self) -> list[SandboxProcess]:
        """Idle sandboxes (no run), least recently active first."""
        return sorted(
            (s for s in self.all() if s.active is None and not s.stopping),
            key=lambda s: s.last_active,
        )

    def __len__(self) -> int:
        with self._lock:
            return len(self._sandboxes)

    # --- room ---------------------------------------------------------------------------

    def occupied(self) -> int:
        """Runtime processes this node has or holds a slot for: conversations' sandboxes,
        spares, reserved slots."""
        with self._lock:
            return len(self._sandboxes) + len(self._spares) + self._reserved

    def reserve(self) -> None:
        """Hold a slot for a sandbox about to be spawned (``add(..., reserved=True)`` or
        :meth:`release` gives it back). Call under ``capacity``, after checking room."""
        with self._lock:
            self._reserved += 1

    def release(self) -> None:
        """Give back a slot held by :meth:`reserve` or :meth:`spare_take` (nothing came
        of it)."""
        with self._lock:
            self._reserved -= 1

    # --- spares -------------------------------------------------------------------------

    def spares(self) -> list[SandboxProcess]:
        """The spares, starting or ready, oldest first."""
        with self._lock:
            return list(self._spares)

    def spare_add(self, spare: SandboxProcess) -> None:
        """Count a new spare (call under ``capacity``, after checking room)."""
        with self._lock:
            self._spares.append(spare)

    def spare_take(self) -> SandboxProcess | None:
        """The oldest spare (the likeliest to be ready), no longer a spare: its slot is
        held as reserved until ``add(..., reserved=True)``, :meth:`spare_return` or
        :meth:`release`. ``None`` when there is none."""
        with self._lock:
            if not self._spares:
                return None
            self._reserved += 1
            return self._spares.pop(0)

    def spare_return(self, spare: SandboxProcess) -> None:
        """Put back a spare :meth:`spare_take` gave, untouched (it was not handed over)."""
        with self._lock:
            self._spares.insert(0, spare)
            self._reserved -= 1

    def spare_discard(self, spare: SandboxProcess) -> bool:
        """Forget a spare (it exited, or is retired); whether it was one."""
        with self._lock:
            if spare in self._spares:
                self._spares.remove(spare)
                return True
            return False

    def state_counts(self) -> dict[str, int]:
        """How many live sandboxes are in each state: ``starting`` (not ready yet),
        ``idle``, ``busy`` (a run), ``stopping``, and ``spare`` (waiting for a new
        conversation, starting or ready)."""
        counts = dict.fromkeys(("starting", "idle", "busy", "stopping"), 0)
        for sandbox in self.all():
            counts[sandbox.state] += 1
        counts["spare"] = len(self.spares())
        return counts


_pool: SandboxPool | None = None
_pool_lock = threading.Lock()


def get_pool() -> SandboxPool:
    """This process's sandbox pool."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = SandboxPool()
        return _pool


def ready_timeout() -> float:
    """``PAW_SANDBOX_READY_TIMEOUT`` in seconds."""
    return float(settings.PAW_SANDBOX_READY_TIMEOUT)
