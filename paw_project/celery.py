"""The Celery app: configured from Django settings (namespace ``CELERY_``), tasks discovered
in every installed app (cookiecutter-django's layout).

The request id of the code that enqueues a task travels in the task headers, so the
worker's log lines for that task carry the same id.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paw_project.settings")

app = Celery("paw_project")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()

_REQUEST_ID_HEADER = "paw_request_id"


@signals.before_task_publish.connect
def _send_request_id(headers: dict[str, Any] | None = None, **_: Any) -> None:
    from paw_project.logging import request_id_var

    if headers is not None:
        headers.setdefault(_REQUEST_ID_HEADER, request_id_var.get())


@signals.setup_logging.connect
def _configure_logging(**_: Any) -> None:
    """Celery's worker and beat log exactly like the web process (``settings.LOGGING``:
    request ids, ``PAW_LOG_JSON``). With a receiver here Celery adds no handler of its own
    and leaves stdout alone."""
    from django.conf import settings

    from paw_project.logging import configure

    configure(settings.LOGGING)


@signals.worker_init.connect
def _node_start(**_: Any) -> None:
    """Every worker process (standalone or embedded) is a sandbox node."""
    import django

    django.setup()
    from paw_project.metrics_http import worker_server_start
    from sandboxes.launch import (
        IsolationUnavailable,
        UngatedRuntime,
        isolation_mode,
        runtime_gate_check,
    )
    from sandboxes.node import node_start

    log = logging.getLogger("paw_project.celery")
    try:
        isolation_mode()  # a node that cannot isolate its sandboxes must not start
        # ... nor one that would run python-agent-harness without being told to.
        warning = runtime_gate_check()
    except (IsolationUnavailable, UngatedRuntime) as exc:
        log.critical("%s", exc)
        # Celery logs and ignores a handler's Exception; SystemExit ends the worker.
        raise SystemExit(f"PAW worker: {exc}") from exc
    if warning:
        log.warning("%s", warning)
    node_start()
    worker_server_start()


@signals.worker_shutdown.connect
def _node_stop(**_: Any) -> None:
    """A stopping worker shuts its sandboxes down: no runtime process outlives it."""
    from paw_project.metrics_http import worker_server_stop
    from sandboxes.node import node_stop

    try:
        node_stop()
    finally:
        worker_server_stop()


@signals.task_prerun.connect
def _receive_request_id(task: Any = None, **_: Any) -> None:
    from paw_project.logging import request_id_var

    request_id = getattr(task.request, _REQUEST_ID_HEADER, None) if task else None
    request_id_var.set(request_id or "-")
