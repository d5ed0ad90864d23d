"""Child processes of tools: each in its own process group, killed as a group.

Every group paw-agent starts is registered here, so ending a run or the process kills
them all (``kill_all``): no orphan ever outlives paw-agent. Commands run under
``guard.py`` so even a SIGKILL of paw-agent takes its tools down.

A tool may leave processes that no group kill reaches: one that called ``setsid`` (its
own session and group) and cleared its environment (``env -i``). paw-agent is therefore a
*child subreaper* (:func:`become_subreaper`, Linux ``PR_SET_CHILD_SUBREAPER``): whatever
a tool started and then abandoned is re-parented to paw-agent instead of to the system's
init, so every process its tools ever started stays among paw-agent's descendants, found
through ``/proc`` by parentage alone (:func:`descendants`) and killed by
:func:`kill_descendants` when a run is stopped and when paw-agent exits. The zombies of
those adopted processes are reaped by :func:`reap_orphans`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from paw_agent.control import RunControl, Stopped

GUARD = str(Path(__file__).resolve().parent / "guard.py")

_groups: set[int] = set()
_groups_lock = threading.Lock()


def tool_environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """What tool processes see: paw-agent's environment without its own credentials, the
    model settings ``OPENAI_*`` (the operator's key), the datasource variables
    ``PAW_DATASOURCE*`` (URLs with passwords; ``run_sql`` is the way to a datasource) and
    the embedding endpoint ``PAW_EMBEDDING*`` (``search_knowledge`` uses it), nor
    any other variable holding the same value as ``OPENAI_API_KEY``; plus ``extra``.
    Everything else the host chose to give the sandbox (the user's own secrets) stays
    visible, since it was given for the agent's code to use."""
    api_key = os.environ.get("OPENAI_API_KEY")
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("OPENAI_", "PAW_DATASOURCE", "PAW_EMBEDDING"))
        and not (api_key and value == api_key)
    }
    env.update(extra or {})
    return env


#: prctl(2) options (<linux/prctl.h>).
PR_SET_CHILD_SUBREAPER = 36

#: Processes spawned here whose exit status their ``Popen`` will collect (never reaped
#: by :func:`reap_orphans`, or ``Popen.wait`` would report a wrong exit code).
_spawned: dict[int, subprocess.Popen] = {}


def become_subreaper() -> bool:
    """Make this process a child subreaper (``prctl(PR_SET_CHILD_SUBREAPER, 1)``, Linux):
    orphaned descendants are re-parented to it. Returns whether it took effect."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


# A deliberate twin of sandboxes/proctable.py's _process_table (the runtime imports
# nothing of PAW's server).
def _parents() -> dict[int, tuple[int, str]]:
    """``{pid: (parent pid, state letter)}`` of every process visible in ``/proc``."""
    table: dict[int, tuple[int, str]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(name)] = (int(fields[1]), fields[0].decode())
    return table


def descendants(root: int | None = None) -> list[int]:
    """The live (not zombie) descendants of ``root`` (default: this process), by parent
    pid in ``/proc``, whatever their session, group or environment."""
    root = os.getpid() if root is None else root
    table = _parents()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], list(children.get(root, []))
    while stack:
        pid = stack.pop()
        if table[pid][1] != "Z":
            found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def reap_orphans() -> int:
    """Collect the exit status of this process's dead children that no ``Popen`` waits
    for (processes adopted as subreaper). Returns how many were reaped."""
    own = os.getpid()
    with _groups_lock:
        for pid in [pid for pid, process in _spawned.items() if process.returncode is not None]:
            del _spawned[pid]
        managed = set(_spawned)
    reaped = 0
    for pid, (parent, state) in _parents().items():
        if parent == own and state == "Z" and pid not in managed:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    reaped += 1
    return reaped


# A deliberate twin of sandboxes/keeper.py's kill_all and sandboxes/proctable.py's
# kill_tools: the runtime imports nothing of PAW's server, the keeper runs standalone.
def kill_descendants(*, rounds: int = 50) -> int:
    """SIGKILL every descendant of this process (tools, the Python kernel, and whatever
    they started and abandoned) until none is left, then reap the adopted ones. A process
    forked during a round is found in the next (re-parented here when its parent dies).
    Returns how many kills were sent."""
    sent = 0
    for _ in range(rounds):
        found = descendants()
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                sent += 1
        time.sleep(0.005)
        reap_orphans()
    with _groups_lock:
        _groups.clear()
    reap_orphans()
    return sent


def register(pid: int) -> None:
    """Remember the process group led by ``pid`` (killed by :func:`kill_all`)."""
    with _groups_lock:
        _groups.add(pid)


def kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` and forget it (no error if gone)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    with _groups_lock:
        _groups.discard(pid)


def kill_all() -> None:
    """SIGKILL every registered process group (paw-agent is exiting)."""
    with _groups_lock:
        pids = list(_groups)
    for pid in pids:
        kill_group(pid)


def spawn(
    argv: list[str], *, cwd: Path, env: dict[str, str], guarded: bool = True, **popen: object
) -> subprocess.Popen:
    """Start ``argv`` as the leader of a new session and process group, registered for
    :func:`kill_all`; under ``guard.py`` unless ``guarded`` is False (a child that watches
    its parent itself). Raises ``OSError`` when it cannot start."""
    if guarded:
        argv = [sys.executable, "-I", "-S", GUARD, str(os.getpid()), "--", *argv]
    process = subprocess.Popen(argv, cwd=cwd, env=env, start_new_session=True, **popen)
    register(process.pid)
    with _groups_lock:
        _spawned[process.pid] = process
    return process


@dataclass
class CommandResult:
    """What a command did: ``exit_code`` (None when killed for its time limit), merged
    stdout+stderr ``output`` (cut to the cap), and whether it ``timed_out``."""

    exit_code: int | None
    output: str
    timed_out: bool = False


def run_command(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    control: RunControl,
    max_output: int = 20_000,
) -> CommandResult:
    """Run ``argv`` to completion in its own group with ``timeout`` seconds; output beyond
    ``max_output`` characters is dropped from the middle. A stopped run kills the group and
    raises ``Stopped``."""
    process = spawn(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    half = max_output // 2
    head = bytearray()
    tail = bytearray()
    total = [0]

    def drain() -> None:
        # Read to the end (a full pipe would block the command), keeping the first and
        # the last half of max_output bytes.
        assert process.stdout is not None
        for block in iter(lambda: process.stdout.read1(65536), b""):
            total[0] += len(block)
            take = max(0, half - len(head))
            head.extend(block[:take])
            tail.extend(block[take:])
            del tail[:-half]

    reader = threading.Thread(target=drain, name="paw-agent-output", daemon=True)
    reader.start()
    timed_out = False
    try:
        control.call(lambda: process.wait(timeout), on_stop=lambda: kill_group(process.pid))
    except subprocess.TimeoutExpired:
        timed_out = True
    except Stopped:
        process.wait()
        raise
    finally:
        kill_group(process.pid)  # whatever the command left behind in its group
    process.wait()
    reader.join(timeout=2)
    omitted = total[0] - len(head) - len(tail)
    marker = f"\n… [{omitted} bytes omitted] …\n".encode() if omitted > 0 else b""
    text = bytes(head) + marker + bytes(tail)
    return CommandResult(
        exit_code=None if timed_out else process.returncode,
        output=text.decode("utf-8", "replace"),
        timed_out=timed_out,
    )
