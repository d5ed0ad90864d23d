"""The sandbox pool: the runtime processes a worker node owns, one per conversation.

Lives in the Celery worker process (a module-level singleton, :func:`get_pool`). Each
:class:`SandboxProcess` has one reader thread turning stdout into parsed lines for the
node's :class:`~sandboxes.pipeline.EventPipeline`, and one thread keeping the tail of
stderr. Ops are written under a lock, one JSON line each. Celery task threads only spawn,
submit and write ops: they never wait for a run to finish.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import json
import logging
import os
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
    SandboxSpec,
    build_command,
    build_environment,
    private_variables,
    takes_secrets_fd,
)
from secrets_vault.masking import StreamMasker, mask_secrets

logger = logging.getLogger(__name__)

STDERR_TAIL_LINES = 40
#: Longest stdout line accepted (bytes); a longer one is cut and kept as malformed.
MAX_LINE_BYTES = 4 * 1024 * 1024
#: Seconds to wait for the runtime to acknowledge a submit (``start``) or refuse it.
SUBMIT_ACK_TIMEOUT = 10.0
#: PROTOCOL.md: ``result`` is written a moment before the next submit is accepted.
SUBMIT_RETRY_DELAY = 0.05


class SandboxError(Exception):
    """A sandbox could not be started or used; ``code`` is the run error code to report."""

    def __init__(self, message: str, *, code: str = "sandbox") -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ReadEntry:
    """One line read from a runtime, tagged with the run it belongs to (as the host knows
    it: the runtime's own ``run_id`` is never trusted for attribution)."""

    run_id: uuid.UUID | None
    line: protocol.ParsedLine


@dataclass
class _Waiter:
    event: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class SandboxProcess:
    """One runtime process: spawn, handshake, ops, reading, stopping.

    ``sandbox_id`` is the ``Sandbox`` row's id; ``current_run`` the run being executed
    (set before its submit is written, cleared when its ``result`` is read).
    """

    def __init__(
        self, *, sandbox_id: uuid.UUID, spec: SandboxSpec, sink: Callable[..., None]
    ) -> None:
        self.sandbox_id = sandbox_id
        self.spec = spec
        self.conversation_id = uuid.UUID(spec.conversation_id)
        self.fingerprint = spec.fingerprint
        self._sink = sink
        self.process: subprocess.Popen | None = None
        self.command: list[str] = []
        self.capabilities: frozenset[str] = frozenset()
        self.current_run: uuid.UUID | None = None
        self.last_active = time.monotonic()
        self.run_started = 0.0
        self.stopping = False
        # Why the host ended a run itself (timeout, budget, policy): {run_id: (code, message)}.
        self.forced_outcome: dict[uuid.UUID, tuple[str, str]] = {}
        self.forced_at: float | None = None
        # Gated tool calls seen per run (each needs one approved confirm before it).
        self.gated_calls: dict[uuid.UUID, int] = {}
        # The latest `notify usage` running totals per run, as the runtime wrote them
        # (``{"input", "output", "rounds", "estimated"}``, unchecked): what a run that ends
        # without a result (crash, kill, lost stdout) is billed for. Popped at its end.
        self.run_usage: dict[uuid.UUID, dict[str, Any]] = {}
        self._stream_masker: StreamMasker | None = None
        self._ready = threading.Event()
        self._ready_error: str | None = None
        self._write_lock = threading.Lock()
        self._waiters: dict[str, _Waiter] = {}
        self._submit_waiters: dict[str, _Waiter] = {}
        self._stderr: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
        self._seq = protocol.SeqTracker()
        self._threads: list[threading.Thread] = []
        self.exited = threading.Event()

    # --- lifecycle ----------------------------------------------------------------------

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def start(self) -> None:
        """Start the process and its reader threads (returns at once; see ``wait_ready``)."""
        env = build_environment(self.spec, sandbox_id=str(self.sandbox_id))
        secrets_fd, private = None, {}
        if takes_secrets_fd():
            private = private_variables(env)
            for name in private:
                del env[name]
            secrets_fd, writer = os.pipe()
        self.command = build_command(self.spec, secrets_fd=secrets_fd)
        try:
            self.process = launch(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=self.spec.workspace,
                env=env,
                start_new_session=True,  # its own process group: we can signal all of it
                bufsize=0,
                pass_fds=(secrets_fd,) if secrets_fd is not None else (),
            )
        finally:
            if secrets_fd is not None:
                os.close(secrets_fd)
        if secrets_fd is not None:
            # Written from a thread: a pipe holds 64 KiB, and the runtime reads it at start.
            threading.Thread(
                target=_write_and_close, args=(writer, json.dumps(private).encode()), daemon=True
            ).start()
        for target, name in ((self._read_stdout, "out"), (self._read_stderr, "err")):
            thread = threading.Thread(
                target=target, name=f"sandbox-{name}-{self.conversation_id}", daemon=True
            )
            thread.start()
            self._threads.append(thread)

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
        """The last lines the runtime wrote to stderr."""
        return "\n".join(self._stderr)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, *, grace: float = 3.0) -> None:
        """Stop the process: ``shutdown`` op, then SIGTERM, then SIGKILL of its process
        group; finally every process still carrying this sandbox's marker is killed (tools
        that moved to another process group). Never raises."""
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
        self._signal_group(signal.SIGKILL)
        self._wait(process, grace)
        kill_marked_processes(str(self.sandbox_id))
        with contextlib.suppress(OSError):
            process.stdin.close()
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=grace)

    def kill(self) -> None:
        """Kill the whole sandbox at once (no grace)."""
        self.stopping = True
        self._signal_group(signal.SIGKILL)
        kill_marked_processes(str(self.sandbox_id))

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

    def send(self, op: str, **fields: Any) -> str:
        """Write one op (with a fresh ``op_id``); returns the op_id.

        Raises :class:`SandboxError` when the process is gone.
        """
        op_id = protocol.new_op_id(op)
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

    def force_end(self, run_id: uuid.UUID, *, code: str, message: str) -> None:
        """End a run for a host reason (timeout, budget, policy): a ``cancel`` op now, and
        the run ends ``error`` with ``code`` when its cancelled result arrives. The node's
        monitor kills the sandbox if the runtime does not comply within the cancel grace."""
        if self.current_run != run_id or run_id in self.forced_outcome:
            return
        self.forced_outcome[run_id] = (code, message)
        self.forced_at = time.monotonic()
        try:
            self.send("cancel", run_id=str(run_id))
        except SandboxError:
            self.kill()

    def submit(self, *, run_id: uuid.UUID, prompt: str) -> None:
        """Submit a run and wait until the runtime acknowledges it with ``start``.

        A refusal because a run is still active is retried once after ~50 ms
        (PROTOCOL.md). Raises :class:`SandboxError` when the runtime refuses, exits, or
        does not answer within ``SUBMIT_ACK_TIMEOUT`` seconds.
        """
        self.current_run = run_id
        self.run_started = time.monotonic()
        for attempt in (1, 2):
            waiter = _Waiter()
            self._submit_waiters[str(run_id)] = waiter
            op_id = self.send("submit", prompt=prompt, run_id=str(run_id))
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
            self.current_run = None
            raise SandboxError(f"the agent runtime refused the run: {waiter.error}", code="sandbox")

    # --- reading ------------------------------------------------------------------------

    def _read_stdout(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        fd = self.process.stdout.fileno()
        pending = b""
        discarding = False  # inside a line over MAX_LINE_BYTES, dropping it up to its newline
        try:
            while True:
                try:
                    chunk = os.read(fd, 1 << 16)
                except OSError:
                    break
                if not chunk:
                    break
                *lines, pending = (pending + chunk).split(b"\n")
                if discarding:
                    if not lines:
                        pending = b""
                        continue
                    lines = lines[1:]
                    discarding = False
                if len(pending) > MAX_LINE_BYTES:
                    # Not a protocol line: keep its start as a malformed line, drop the rest.
                    lines.append(pending[:4000] + b" [cut]")
                    pending = b""
                    discarding = True
                entries = [entry for raw in lines if raw.strip() for entry in self._take(raw)]
                if entries:
                    self.last_active = time.monotonic()
                    self._sink(self, entries)
            if pending.strip() and not discarding:
                entries = list(self._take(pending))
                if entries:
                    self._sink(self, entries)
        except Exception:
            logger.exception("sandbox %s: reader failed", self.sandbox_id)
        finally:
            self._on_eof()

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
            if line.type == "error":
                waiter = self._waiters.get(line.op_id or "")
                if waiter is not None:
                    waiter.error = line.message or line.error_code or "refused"
                    waiter.event.set()
                return [ReadEntry(run_id=self.current_run, line=line)]
            return []  # pong, hello: answers to our own probes
        run_id = self.current_run
        entries = [ReadEntry(run_id=run_id, line=line)]
        if isinstance(line, protocol.RunLine):
            if line.type == "start":
                self._seq = protocol.SeqTracker()
                waiter = self._submit_waiters.get(line.run_id)
                if waiter is not None:
                    waiter.event.set()
            problem = self._seq.observe(line.seq)
            if run_id is not None and line.run_id and line.run_id != str(run_id):
                problem = f"a line for run {line.run_id[:64]!r} arrived during run {run_id}"
            if problem:
                entries.append(
                    ReadEntry(run_id=run_id, line=protocol.Anomaly(f"protocol: {problem}"))
                )
            if line.type == "notify" and line.kind == "usage" and run_id is not None:
                if isinstance(line.data, dict):
                    self.run_usage[run_id] = dict(line.data)
            elif line.type == "result":
                self.current_run = None
        return entries

    def _read_stderr(self) -> None:
        assert self.process is not None and self.process.stderr is not None
        for raw in iter(self.process.stderr.readline, b""):
            text = raw.decode("utf-8", errors="replace").rstrip()
            if text:
                self._stderr.append(text[:2000])

    def _on_eof(self) -> None:
        assert self.process is not None
        try:
            returncode = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._signal_group(signal.SIGKILL)
            returncode = self.process.wait()
        kill_marked_processes(str(self.sandbox_id))
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=2)
        self.exited.set()
        self._ready.set()
        if self._ready_error is None and not self.capabilities:
            self._ready_error = f"the agent runtime exited (code {returncode}) before it was ready"
        for waiter in list(self._waiters.values()):
            waiter.event.set()
        self._sink(self, None, returncode=returncode)


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
    """The live sandboxes of this node, by conversation id."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._sandboxes: dict[uuid.UUID, SandboxProcess] = {}
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

    def add(self, sandbox: SandboxProcess) -> None:
        with self._lock:
            self._sandboxes[sandbox.conversation_id] = sandbox

    def discard(self, sandbox: SandboxProcess) -> None:
        with self._lock:
            if self._sandboxes.get(sandbox.conversation_id) is sandbox:
                del self._sandboxes[sandbox.conversation_id]

    def all(self) -> list[SandboxProcess]:
        with self._lock:
            return list(self._sandboxes.values())

    def idle_lru(self) -> list[SandboxProcess]:
        """Idle sandboxes (no run), least recently active first."""
        return sorted(
            (s for s in self.all() if s.current_run is None and not s.stopping),
            key=lambda s: s.last_active,
        )

    def __len__(self) -> int:
        with self._lock:
            return len(self._sandboxes)


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
