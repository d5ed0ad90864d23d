"""Drives a real runtime process (``paw-agent serve`` or ``python-agent-harness serve``)
over its stdin/stdout, the way PAW's host does: one JSON op per line in, one JSON line
per event out, read on a thread so a test can wait for lines with a timeout."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.processes import PYTHON

VENV_BIN = Path(PYTHON).parent
PAW_AGENT = "paw-agent"
HARNESS = "python-agent-harness"
RUNTIMES = (PAW_AGENT, HARNESS)


def runtime_command(kind: str, project: Path, *flags: str) -> list[str]:
    """The serve command of runtime ``kind`` for the workspace ``project``."""
    return [str(VENV_BIN / kind), "serve", "--project", str(project), *flags]


class Runtime:
    """A running runtime process. ``lines`` holds every stdout line parsed so far."""

    def __init__(
        self, command: list[str], env: dict[str, str], cwd: Path, pass_fds: tuple[int, ...] = ()
    ) -> None:
        self.stderr_file = tempfile.TemporaryFile()  # noqa: SIM115 - closed in close()
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            command,
            cwd=cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr_file,
            start_new_session=True,
            pass_fds=pass_fds,
        )
        self.lines: list[dict[str, Any]] = []
        self.raw: list[bytes] = []
        self._queue: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._pumped = threading.Thread(target=self._pump, daemon=True)
        self._pumped.start()

    def _pump(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            self.raw.append(raw)
            line = json.loads(raw)  # a line that is not JSON fails the test loudly
            line["_at"] = time.monotonic()
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stderr(self) -> str:
        self.stderr_file.seek(0)
        return self.stderr_file.read().decode(errors="replace")

    def send(self, op: dict[str, Any] | str | bytes) -> None:
        """Write one op line (a dict as JSON; str/bytes as given, for malformed input)."""
        if isinstance(op, dict):
            data = json.dumps(op).encode() + b"\n"
        elif isinstance(op, str):
            data = op.encode() + b"\n"
        else:
            data = op
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def next(self, timeout: float = 30.0) -> dict[str, Any]:
        """The next line; fails after ``timeout`` seconds or at EOF."""
        try:
            line = self._queue.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"no line within {timeout} s; stderr:\n{self.stderr()[-3000:]}"
            ) from None
        if line is None:
            self._queue.put(None)
            raise AssertionError(f"stdout closed; stderr:\n{self.stderr()[-3000:]}")
        return line

    def wait_for(
        self, predicate: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> dict[str, Any]:
        """The next line matching ``predicate`` (lines before it are skipped)."""
        deadline = time.monotonic() + timeout
        while True:
            line = self.next(max(0.01, deadline - time.monotonic()))
            if predicate(line):
                return line

    def ready(self, timeout: float = 30.0) -> dict[str, Any]:
        """The first line, which must be ``ready``."""
        line = self.next(timeout)
        assert line["type"] == "ready", line
        return line

    def run_lines(self, run_id: str, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Every line of run ``run_id`` up to and including its ``result``."""
        collected = []
        deadline = time.monotonic() + timeout
        while True:
            line = self.next(max(0.01, deadline - time.monotonic()))
            if line.get("run_id") == run_id:
                collected.append(line)
                if line["type"] == "result":
                    return collected

    def submit(
        self, prompt: str, run_id: str = "run-1", timeout: float = 60.0, **extra: Any
    ) -> list[dict[str, Any]]:
        """Submit ``prompt`` and return the run's lines up to its result."""
        self.send({"op": "submit", "prompt": prompt, "run_id": run_id, **extra})
        return self.run_lines(run_id, timeout)

    def error(self, timeout: float = 10.0) -> dict[str, Any]:
        """The next ``error`` control line."""
        return self.wait_for(lambda x: x["type"] == "error", timeout)

    def close_stdin(self) -> None:
        assert self.process.stdin is not None
        with contextlib.suppress(BrokenPipeError):
            self.process.stdin.close()

    def wait_exit(self, timeout: float = 15.0) -> int:
        return self.process.wait(timeout)

    def remaining_lines(self, timeout: float = 15.0) -> list[dict[str, Any]]:
        """Every line until stdout closes."""
        rest = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError("stdout did not close") from None
            if line is None:
                self._queue.put(None)
                return rest
            rest.append(line)

    def close(self) -> None:
        """End the process and everything in its group (no leftovers between tests)."""
        if self.process.poll() is None:
            self.close_stdin()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(5)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        self._pumped.join(5)
        for pipe in (self.process.stdin, self.process.stdout):  # its pipes, read or not
            with contextlib.suppress(OSError):
                pipe.close()
        self.stderr_file.close()


def of_type(lines: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The lines of ``type`` ``kind``."""
    return [x for x in lines if x["type"] == kind]


def notifies(lines: list[dict[str, Any]], kind: str) -> list[Any]:
    """The ``data`` of the notify lines of ``kind``."""
    return [x["data"] for x in lines if x["type"] == "notify" and x["kind"] == kind]


def answer_text(lines: list[dict[str, Any]]) -> str:
    """The streamed deltas joined."""
    return "".join(x["text"] for x in lines if x["type"] == "delta")


@contextlib.contextmanager
def spawned(
    command: list[str], env: dict[str, str], cwd: Path, pass_fds: tuple[int, ...] = ()
) -> Iterator[Runtime]:
    """A :class:`Runtime` that is always cleaned up (``pass_fds``: descriptors it inherits)."""
    runtime = Runtime(command, env, cwd, pass_fds)
    try:
        yield runtime
    finally:
        runtime.close()


def processes_with(marker: str) -> list[int]:
    """PIDs of live processes whose command line or environment contains ``marker``
    (zombies excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            status = (entry / "status").read_text()
            if "\nState:\tZ" in status:
                continue
            data = (entry / "cmdline").read_bytes() + (entry / "environ").read_bytes()
        except OSError:
            continue
        if marker.encode() in data:
            found.append(int(entry.name))
    return found
