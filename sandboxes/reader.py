"""The one reader of every sandbox's stdout in this process (:class:`OutputReader`), and
what a sandbox does with what it reads (:class:`SandboxOutput`: whole lines parsed,
control lines answered, the rest tagged with their run for the node's pipeline; its
stderr's tail; its exit).

The reader is passed to each :class:`~sandboxes.process.SandboxProcess` (the node's,
:func:`output_reader`): a process never looks it up, and this module imports no process.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import selectors
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Any

from sandboxes import protocol
from sandboxes.proctable import kill_marked_processes
from sandboxes.run import ReadEntry

if TYPE_CHECKING:
    from sandboxes.process import SandboxProcess

logger = logging.getLogger(__name__)

#: Longest stdout line accepted (bytes); a longer one is cut and kept as malformed.
MAX_LINE_BYTES = 4 * 1024 * 1024


class SandboxOutput:
    """Reading one sandbox's output (a mixin of :class:`~sandboxes.process.SandboxProcess`,
    whose attributes it uses): :class:`OutputReader` calls :meth:`_read_available` when
    its stdout is readable and :meth:`_ended` at its end."""

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
        self.package_index.watch(entries)
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
