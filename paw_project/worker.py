"""A worker node and Celery beat, as PAW runs them: ``python -m paw_project.worker`` and
``python -m paw_project.beat``.

The Celery command lines follow from the settings (the node's name and its queues
``runs,sandbox.<node>``, ``PAW_WORKER_CONCURRENCY``, ``PAW_LOG_LEVEL``, ``--quiet`` with
``PAW_LOG_JSON``), so ``runpaw``, the systemd units and the Compose file in ``deploy/``
start the same processes without repeating those options. The process then *becomes*
Celery (``exec``): same pid, so a service manager's signals reach the worker itself, which
shuts its sandboxes down before it exits.
"""

from __future__ import annotations

import os
import sys


def celery_argv(role: str) -> list[str]:
    """The command line of a ``worker`` or ``beat`` process (``argv[0]`` is this Python).
    Raises ``ValueError`` for another role."""
    from django.conf import settings

    from sandboxes.enqueue import node_queues

    celery = [sys.executable, "-m", "celery", "-A", "paw_project"]
    # With JSON logs, Celery's banners (plain text on stdout) are left out.
    if settings.PAW_LOG_JSON:
        celery.append("--quiet")
    if role == "worker":
        node = settings.PAW_NODE_NAME
        return [
            *celery, "worker", "--pool", "threads",
            "--concurrency", str(settings.PAW_WORKER_CONCURRENCY),
            "-n", f"paw@{node}", "-Q", ",".join(node_queues(node)),
            "--loglevel", settings.PAW_LOG_LEVEL,
        ]  # fmt: skip
    if role == "beat":
        return [*celery, "beat", "--loglevel", settings.PAW_LOG_LEVEL]
    raise ValueError(f"no such PAW process: {role!r} (worker or beat)")


def main(role: str) -> None:
    """Replace this process by Celery's ``role`` process (never returns)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paw_project.settings")
    import django

    django.setup()
    from django.conf import settings

    # Beat keeps its schedule there; a fresh install may not have made the folder yet.
    settings.VAR_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)
    argv = celery_argv(role)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(argv[0], argv)  # noqa: S606 - the command line is built above, not a shell


if __name__ == "__main__":
    main("worker")
