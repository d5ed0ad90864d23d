"""Fixtures for tests with more than one worker node, or a node of another size.

The session's ``worker_node`` (``tests/conftest.py``) is one node named
``settings.PAW_NODE_NAME``. :class:`ExtraWorkerNode` is another real Celery worker process
on the same Redis, database and workspace root, with a name (and so a ``sandbox.<node>``
queue) of its own and any concurrency. Every node consumes the shared ``runs`` queue;
:func:`stop_consuming_runs` and :func:`consume_runs` decide, through Celery's remote
control, which nodes take new conversations, so a test knows where a run must land.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest
from django.conf import settings

from paw_project.celery import app
from tests.conftest import HARNESS, PAW_AGENT, WorkerNode
from tests.processes import worker_database_url
from tests.sandboxes.scenarios import FAKE


def require_bubblewrap() -> None:
    """Fail the test when bubblewrap is missing: the sandbox isolation is part of what PAW
    promises, and CI installs it (``.ci/run``). ``PAW_TEST_ALLOW_NO_BWRAP=1`` skips
    instead, for a machine that cannot have it."""
    if shutil.which("bwrap") is not None:
        return
    if os.environ.get("PAW_TEST_ALLOW_NO_BWRAP") == "1":
        pytest.skip("bubblewrap is not installed (PAW_TEST_ALLOW_NO_BWRAP=1)")
    pytest.fail(
        "bubblewrap is not installed, so the sandbox isolation cannot be tested: install it "
        "(apt-get install bubblewrap; .ci/run does) or set PAW_TEST_ALLOW_NO_BWRAP=1 to skip "
        "the tests that need it",
        pytrace=False,
    )


class ExtraWorkerNode(WorkerNode):
    """A further worker node: ``PAW_NODE_NAME=name``, ``--concurrency concurrency``.

    Started like the session's node (threads pool, the scripted model as the default
    provider); ``use(command, **env)`` (re)starts it, ``stop()`` ends it (SIGTERM, then
    SIGKILL of its process group).
    """

    def __init__(self, database_url: str, model, *, name: str, concurrency: int = 8) -> None:
        super().__init__(database_url, model, name=name, concurrency=concurrency)


def running(node: WorkerNode) -> bool:
    """Whether the node's worker process is up."""
    return node.process is not None and node.process.poll() is None


def _control_runs_queue(command: str, nodes: tuple[WorkerNode, ...]) -> None:
    """Send a Celery remote-control ``command`` about the ``runs`` queue to the running
    ``nodes`` and check that each one answered."""
    destination = [f"paw@{node.name}" for node in nodes if running(node)]
    if not destination:
        return
    replies = app.control.broadcast(
        command, arguments={"queue": "runs"}, destination=destination, reply=True, timeout=5
    )
    answered = {name for reply in replies for name in reply}
    assert answered == set(destination), f"{command}: no answer from {set(destination) - answered}"


def stop_consuming_runs(*nodes: WorkerNode) -> None:
    """The (running) nodes stop taking tasks from the shared ``runs`` queue; their own
    ``sandbox.<node>`` queue stays. Returns once each node has confirmed."""
    _control_runs_queue("cancel_consumer", nodes)


def consume_runs(*nodes: WorkerNode) -> None:
    """The (running) nodes take tasks from the shared ``runs`` queue again."""
    _control_runs_queue("add_consumer", nodes)


@pytest.fixture
def second_node(django_db_blocker, scripted_model) -> Iterator[ExtraWorkerNode]:
    """Another worker node running ``paw-agent serve``, named ``<PAW_NODE_NAME>-b``."""
    with django_db_blocker.unblock():
        node = ExtraWorkerNode(
            worker_database_url(), scripted_model, name=f"{settings.PAW_NODE_NAME}-b"
        )
    node.use(PAW_AGENT)
    yield node
    node.stop()


@pytest.fixture
def solo_node(worker_node, django_db_blocker, scripted_model) -> Iterator[ExtraWorkerNode]:
    """A worker node with one Celery thread (``--concurrency 1``), named
    ``<PAW_NODE_NAME>-solo``, running ``paw-agent serve``: the only node taking new runs
    while the test lasts (the session's node, if it is up, leaves the ``runs`` queue and
    takes it up again afterwards)."""
    with django_db_blocker.unblock():
        node = ExtraWorkerNode(
            worker_database_url(),
            scripted_model,
            name=f"{settings.PAW_NODE_NAME}-solo",
            concurrency=1,
        )
    node.use(PAW_AGENT)
    stop_consuming_runs(worker_node)
    yield node
    node.stop()
    consume_runs(worker_node)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failing test shows the end of the log of every extra worker node it started."""
    report = yield
    if report.failed:
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, ExtraWorkerNode) and value.process is not None:
                report.sections.append((f"{name} log (last 6000 chars)", value.output()[-6000:]))
    return report


@pytest.fixture(params=[PAW_AGENT, HARNESS], ids=["paw-agent", "harness"], scope="module")
def runtime(request):
    """Each runtime PAW drives: its own paw-agent, then python-agent-harness."""
    return request.param


@pytest.fixture
def worker(worker_node, runtime):
    """The session's worker node running ``runtime``."""
    return worker_node.use(runtime)


@pytest.fixture
def fake_worker(worker_node):
    """The session's worker node running the fake runtime (no jail, a 3 s ready timeout)."""
    return worker_node.use(FAKE, PAW_SANDBOX_ISOLATION="none", PAW_SANDBOX_READY_TIMEOUT="3")
