"""``python -I -S keeper.py PARENT_PID -- COMMAND...``: the first process of a sandbox run
without bubblewrap (``PAW_SANDBOX_ISOLATION=none``), so that none of its processes
outlives it, whatever they do.

Without a PID namespace, a process that calls ``setsid`` and clears its environment
(``env -i``) escapes every process-group kill and every environment marker. The keeper
makes itself a *child subreaper* (``prctl(PR_SET_CHILD_SUBREAPER)``): every process of
the sandbox that loses its parent is re-parented to the keeper instead of the system's
init, so the sandbox's processes are exactly the keeper's descendants, found by
parentage in ``/proc`` alone. The keeper forks COMMAND (the runtime), then waits; it
kills every descendant (SIGKILL, round after round until none is left) and exits:

- when the runtime exits (idle shutdown, a crash): as the runtime did (its exit code, or
  the signal that killed it), so the host sees the runtime's own ``returncode``;
- on SIGUSR1 (the host kills the sandbox) and when PARENT_PID, the worker, is gone: its
  parent-death signal (``PR_SET_PDEATHSIG``, SIGUSR1) and a poll of its parent pid — a
  ``kill -9`` of the worker takes the whole sandbox down. It then ends by SIGKILL, as a
  killed sandbox always did;
- SIGTERM, SIGINT and SIGHUP leave the keeper be: the host signals the sandbox's process
  group, which the runtime is in too (passing them on would make a second signal, which
  paw-agent takes as "die now"); the keeper waits for the runtime to exit.

The guarantee ends where the keeper does: only a SIGKILL of the keeper itself (by pid; the
host never sends one before SIGUSR1) would leave the descendants to the system's init.
Standalone on purpose: stdlib only, started with ``-I -S``, never imports PAW.
"""

import contextlib
import ctypes
import ctypes.util
import os
import signal
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SIGNALS = {signal.SIGCHLD, signal.SIGUSR1, signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def _prctl(option: int, value: int) -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _table() -> dict[int, tuple[int, str]]:
    """``{pid: (parent pid, state)}`` from ``/proc``."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", "rb") as stat:
                    fields = stat.read().rsplit(b")", 1)[1].split()
                table[int(name)] = (int(fields[1]), fields[0].decode())
            except (OSError, IndexError, ValueError):
                continue
    return table


def descendants() -> list[int]:
    """This process's live descendants."""
    table = _table()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in table.items():
        children.setdefault(parent, []).append(pid)
    found, stack = [], list(children.get(os.getpid(), []))
    while stack:
        pid = stack.pop()
        if table[pid][1] != "Z":
            found.append(pid)
        stack.extend(children.get(pid, []))
    return found


def reap() -> dict[int, int]:
    """Collect every dead child; ``{pid: wait status}``."""
    done = {}
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return done
        if pid == 0:
            return done
        done[pid] = status


# A deliberate twin of paw_agent/procs.py's kill_descendants: the keeper runs on its own
# (python -I -S, stdlib only), importing nothing of PAW's nor of the runtime's.
def kill_all(rounds: int = 100) -> None:
    """SIGKILL every descendant until none is left (a fork during a round is found in
    the next: its child is re-parented here when its parent dies), reaping as it goes."""
    for _ in range(rounds):
        found = descendants()
        if not found:
            break
        for pid in found:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.005)
        reap()
    reap()


def exit_like(status: int) -> None:
    """Exit as the runtime did: with its exit code, or killed by the same signal (so the
    host sees the same ``returncode``)."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        if number not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(number, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {number})
        os.kill(os.getpid(), number)
        os._exit(128 + number)
    os._exit(os.waitstatus_to_exitcode(status))


def main() -> None:
    """Start COMMAND under this keeper; never returns."""
    parent = int(sys.argv[1])
    argv = sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:]
    if not _prctl(PR_SET_CHILD_SUBREAPER, 1):
        os.write(2, b"paw keeper: cannot become a child subreaper; orphans may escape\n")
    _prctl(PR_SET_PDEATHSIG, signal.SIGUSR1)
    signal.pthread_sigmask(signal.SIG_BLOCK, SIGNALS)
    if os.getppid() != parent:  # the worker went before the death signal was armed
        os._exit(1)
    runtime = os.fork()
    if runtime == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, SIGNALS)
        try:
            os.execvp(argv[0], argv)  # noqa: S606 - the runtime, argv as given
        except OSError as exc:
            os.write(2, f"paw keeper: cannot run {argv[0]}: {exc}\n".encode())
        os._exit(127)
    # The runtime has the pipes to the host; the keeper keeps none of them open (the host
    # sees the end of the runtime's output when the runtime's tree is gone).
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.closerange(3, 65536)
    while True:
        received = signal.sigtimedwait(SIGNALS, 0.5)
        status = reap().get(runtime)
        if status is not None:
            kill_all()
            exit_like(status)
        if (received is not None and received.si_signo == signal.SIGUSR1) or (
            os.getppid() != parent
        ):
            kill_all()
            exit_like(signal.SIGKILL)  # as a SIGKILL of the sandbox always did


if __name__ == "__main__":
    main()
