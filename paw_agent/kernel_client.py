"""paw-agent's side of the persistent Python process (``kernel.py``): started on first use,
in the workspace, in its own process group; killed (and restarted on the next use) when a
call runs out of time or the run is cancelled."""

from __future__ import annotations

import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from paw_agent import procs
from paw_agent.control import RunControl, Stopped

# The directory holding the ``sandboxes`` package, so the kernel can import its modules.
CODE_ROOT = str(Path(__file__).resolve().parents[2])


class KernelTimeout(Exception):
    """A request ran longer than its limit; the kernel was killed (its variables are
    gone)."""


class KernelDied(Exception):
    """The kernel process ended during a request (it crashed or was killed)."""


class PythonKernel:
    """One persistent Python process per sandbox. ``workspace`` is its working directory;
    ``packages_dir`` (``install_package``'s target) is on its import path. Thread-safe: one
    request at a time."""

    def __init__(self, workspace: Path, packages_dir: Path) -> None:
        self.workspace = workspace
        self.packages_dir = packages_dir
        self._process: subprocess.Popen | None = None
        self._ctl_out: int | None = None  # we write requests here
        self._ctl_in: int | None = None  # we read answers here
        self._lock = threading.Lock()

    @property
    def running(self) -> bool:
        """Whether the kernel process is alive."""
        return self._process is not None and self._process.poll() is None

    def _start(self) -> None:
        request_read, request_write = os.pipe()
        answer_read, answer_write = os.pipe()
        python_path = [str(self.packages_dir), CODE_ROOT]
        env = procs.tool_environment(
            {
                "PYTHONPATH": os.pathsep.join(python_path),
                "MPLBACKEND": "module://paw_agent.mpl_backend",
                "PYTHONUNBUFFERED": "1",
                "PYTHONDONTWRITEBYTECODE": "1",
            }
        )
        try:
            # Not guarded: the kernel watches its parent itself (kernel._watch_parent).
            self._process = procs.spawn(
                [
                    sys.executable,
                    "-m",
                    "paw_agent.kernel",
                    str(request_read),
                    str(answer_write),
                ],
                cwd=self.workspace,
                env=env,
                guarded=False,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(request_read, answer_write),
            )
        finally:
            os.close(request_read)
            os.close(answer_write)
        self._ctl_out, self._ctl_in = request_write, answer_read

    def stop(self) -> None:
        """Kill the kernel's process group (idempotent); the next request starts a new
        one."""
        process, self._process = self._process, None
        for fd in (self._ctl_out, self._ctl_in):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._ctl_out = self._ctl_in = None
        if process is not None:
            procs.kill_group(process.pid)
            process.wait()

    def request(
        self, payload: dict[str, Any], *, timeout: float, control: RunControl
    ) -> dict[str, Any]:
        """Send one request (see ``kernel.py``) and return its answer.

        Raises :class:`KernelTimeout` after ``timeout`` seconds, :class:`KernelDied` if the
        process ends, ``Stopped`` if the run stops (each after killing the kernel).
        """
        with self._lock:
            if not self.running:
                self.stop()
                self._start()
            assert self._ctl_out is not None and self._ctl_in is not None
            os.write(self._ctl_out, json.dumps(payload).encode() + b"\n")
            deadline = time.monotonic() + timeout
            buffer = bytearray()
            try:
                while not buffer.endswith(b"\n"):
                    control.check()
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise KernelTimeout(f"no answer within {timeout:g} s")
                    ready, _, _ = select.select([self._ctl_in], [], [], min(0.05, left))
                    if ready:
                        block = os.read(self._ctl_in, 1 << 16)
                        if not block:
                            raise KernelDied("the Python process ended")
                        buffer.extend(block)
            except (KernelTimeout, KernelDied, Stopped):
                self.stop()
                raise
            return json.loads(buffer)
