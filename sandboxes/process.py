"""One runtime process of a worker node (:class:`SandboxProcess`): spawn, handshake, ops,
hand-over of a spare, masking; and the launcher thread that starts every one of them
(:func:`launch`).

Lives in the Celery worker process. Its stdout is read by the node's
:class:`~sandboxes.reader.OutputReader` (passed in: ``reader``), which turns it into parsed
lines for the node's :class:`~sandboxes.pipeline.EventPipeline`; each process has one
thread keeping the tail of its stderr. Ops are written under a lock, one JSON line each.
Celery task threads only spawn, submit and write ops: they never wait for a run to finish.
Stopping and killing: :mod:`sandboxes.proctable`; reading: :mod:`sandboxes.reader`; the
run: :mod:`sandboxes.run`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import os
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from sandboxes import protocol
from sandboxes.launch import (
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
from sandboxes.package_index import PackageIndexWindow
from sandboxes.proctable import ProcessKilling
from sandboxes.reader import SandboxOutput
from sandboxes.run import ActiveRun, SandboxError
from secrets_vault.masking import StreamMasker, mask_secrets

if TYPE_CHECKING:
    from sandboxes.reader import OutputReader

logger = logging.getLogger(__name__)

STDERR_TAIL_LINES = 40
#: Seconds to wait for the runtime to acknowledge a submit (``start``) or refuse it.
SUBMIT_ACK_TIMEOUT = 10.0
#: PROTOCOL.md: ``result`` is written a moment before the next submit is accepted.
SUBMIT_RETRY_DELAY = 0.05
#: Seconds a spare gets to take its hand-over (the op is answered at once).
HANDOVER_TIMEOUT = 10.0


@dataclass
class _Waiter:
    event: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class SandboxProcess(ProcessKilling, SandboxOutput):
    """One runtime process: spawn, handshake, ops, reading, stopping.

    ``sandbox_id`` is the ``Sandbox`` row's id; ``active`` the run being executed (an
    :class:`ActiveRun`, set before its submit is written, closed when its ``result`` is
    read or the process exits); ``last_run`` the one before.

    ``sink`` takes its read entries (the node's pipeline), ``reader`` reads its stdout
    (:class:`~sandboxes.reader.OutputReader`).

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
        reader: OutputReader,
        on_network_refused: Callable[[SandboxProcess, str, str], None] | None = None,
        spare: bool = False,
    ) -> None:
        self.sandbox_id = sandbox_id
        #: Reads its stdout once it starts (the node's :func:`~sandboxes.reader.output_reader`).
        self._reader = reader
        self.spare = spare
        #: The folder the runtime was started in (a spare's stays its path in the jail).
        self.started_in = spec.workspace
        self._secrets_writer: int | None = None  # a spare's, written at its hand-over
        self._start_lock = threading.Lock()
        #: The node-side forwarder of an isolated network (``PAW_SANDBOX_NETWORK``).
        self.network: SandboxNetwork | None = None
        #: Opened for an approved ``install_package`` only (``sandboxes/package_index.py``).
        self.package_index = PackageIndexWindow(sandbox_id, lambda: self.network)
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
        env = build_environment(self.spec, sandbox_id=str(self.sandbox_id), spare=self.spare)
        secrets_fd, private = None, {}
        if takes_secrets_fd():
            private = private_variables(env, self.spec.datasources)
            for name in private:
                del env[name]
            secrets_fd, writer = os.pipe()
        elif self.spare:
            raise SandboxError("only paw-agent can be a spare", code="sandbox_start")
        plan, folder = None, None
        if network_mode() == "isolated":
            plan = (
                spare_plan()
                if self.spare
                else network_plan({**env, **private}, self.spec.datasources)
            )
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
        self._reader.add(self)

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
