"""Shared fixtures: a real Celery worker node on the test Redis and database."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from django.conf import settings

from tests.support import PYTHON, child_process, output_of, worker_database_url


@pytest.fixture(scope="session")
def celery_worker(django_db_setup, django_db_blocker) -> Iterator[str]:
    """A real ``celery worker`` process (threads pool) for this session's node name,
    consuming ``runs`` and ``sandbox.<node>`` on the test Redis, writing to the test
    database. Yields the node name. Tests using it need ``django_db(transaction=True)``
    so what they write is committed and visible to the worker."""
    from paw_project.celery import app
    from paw_project.embedded import node_queues

    node = settings.PAW_NODE_NAME
    with django_db_blocker.unblock():
        database_url = worker_database_url()
    command = [
        PYTHON,
        "-m",
        "celery",
        "-A",
        "paw_project",
        "worker",
        "--pool",
        "threads",
        "--concurrency",
        "8",
        "-n",
        f"paw@{node}",
        "-Q",
        ",".join(node_queues(node)),
        "--loglevel",
        "INFO",
        "--without-mingle",
        "--without-gossip",
    ]
    with child_process(command, env={"PAW_DATABASE_URL": database_url}) as worker:
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=[f"paw@{node}"], timeout=0.5):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the test Celery worker did not start:\n{output_of(worker)}")
        yield node
