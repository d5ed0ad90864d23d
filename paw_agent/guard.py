"""``python -I -S guard.py PARENT_PID -- COMMAND...``: run COMMAND so it cannot outlive
paw-agent.

Tools run in their own process group (so a cancel kills the tool's whole tree without
touching paw-agent). A host that SIGKILLs paw-agent's group would then miss them; this
guard, the leader of the tool's group, kills its group as soon as paw-agent is gone
(its parent changes). Standalone on purpose: stdlib only, started with ``-I -S`` in
~10 ms. Exits with the command's exit code (128 + N when killed by signal N).
"""

import os
import signal
import sys


def main() -> None:
    """Fork COMMAND, wait for it, watch the parent; never returns."""
    parent = int(sys.argv[1])
    argv = sys.argv[3:] if sys.argv[2:3] == ["--"] else sys.argv[2:]
    # SIGCHLD stays pending (blocked) so sigtimedwait wakes the moment the command ends.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
    pid = os.fork()
    if pid == 0:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        try:
            os.execvp(argv[0], argv)  # noqa: S606 - the command, argv as given
        except OSError as exc:
            os.write(2, f"cannot run {argv[0]}: {exc}\n".encode())
        os._exit(127)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            code = os.waitstatus_to_exitcode(status)
            os._exit(code if code >= 0 else 128 - code)
        if os.getppid() != parent:
            os.killpg(0, signal.SIGKILL)
        signal.sigtimedwait({signal.SIGCHLD}, 0.5)


if __name__ == "__main__":
    main()
