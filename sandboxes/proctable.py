"""The processes of a sandbox as the host sees them: the process table (``/proc``), the
tools a run left behind, and the killing of a sandbox's processes (its group, the
keeper's descendants, every process carrying its marker).

:class:`ProcessKilling` is the part of :class:`~sandboxes.process.SandboxProcess` that
stops and kills: it uses the process's ``process``, ``command``, ``network``,
``sandbox_id``, ``stopping``, its start lock, reader threads and ``send``. Linux only
(reads ``/proc``).
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

from sandboxes.launch import KEEPER
from sandboxes.run import SandboxError

logger = logging.getLogger(__name__)

#: Seconds the keeper gets to kill a sandbox's processes on SIGUSR1 (it takes milliseconds).
KEEPER_KILL_SECONDS = 2.0


# A deliberate twin of paw_agent/procs.py's _parents (the runtime imports nothing of PAW's
# server), with each process's start time.
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


class ProcessKilling:
    """Stopping and killing a sandbox's processes (a mixin of
    :class:`~sandboxes.process.SandboxProcess`, whose attributes it uses)."""

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

    # A deliberate twin of paw_agent/procs.py's kill_descendants (the runtime imports
    # nothing of PAW's server): the same rounds of SIGKILL, here from outside the sandbox.
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
