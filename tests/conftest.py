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


# --- API helpers ------------------------------------------------------------------------

PASSWORD = "correct horse battery staple 42"


@pytest.fixture
def make_user(db):
    """``make_user(username="alice")``: a user whose password is ``PASSWORD``."""
    from accounts.models import User

    def make(username: str = "alice", **fields) -> User:
        return User.objects.create_user(username=username, password=PASSWORD, **fields)

    return make


@pytest.fixture
def user(make_user):
    return make_user("alice")


@pytest.fixture
def other_user(make_user):
    return make_user("mallory")


def api_client_for(user=None):
    """A DRF test client carrying a fresh JWT access token of ``user`` (anonymous if None)."""
    from rest_framework.test import APIClient

    from accounts.services import auth_token_pair_for

    client = APIClient()
    if user is not None:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {auth_token_pair_for(user=user)['access']}")
    return client


@pytest.fixture
def api(user):
    """A client authenticated as ``user`` with a JWT."""
    return api_client_for(user)


@pytest.fixture
def other_api(other_user):
    """A client authenticated as ``other_user`` with a JWT."""
    return api_client_for(other_user)


def throttle_key(scope: str, ident: object) -> str:
    """The cache key DRF's throttles use for ``scope`` and ``ident`` (a user id or an IP)."""
    return f"throttle_{scope}_{ident}"


@pytest.fixture
def reset_throttles():
    """Forget the per-IP auth throttle counter of the test client's 127.0.0.1, before and
    after the test. Only that key is deleted: the shared Redis database also holds the
    Celery broker's queues. (Per-user counters need no reset: user ids are never reused.)"""
    from django.core.cache import cache

    def reset() -> None:
        cache.delete(throttle_key("auth", "127.0.0.1"))

    reset()
    yield reset
    reset()
