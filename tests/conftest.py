"""Shared fixtures: the project's scripted model server, a real Celery worker node, and
the suite-wide scan for secret values.

The worker is a real ``celery worker`` process (threads pool) on the test Redis and the
test database, with the scripted model as its default provider. It is started once and
restarted only when a test asks for another runtime command (``worker.use(...)``), so
tests that need the same runtime share it. Tests using it need
``django_db(transaction=True)`` so what they write is committed and visible to it.

Every test is scanned: no response of the test clients, websocket message or
channel-layer message it receives may contain a known secret value
(``tests/secrets_vault/leak_scan.py``); a leak fails the test.
"""

from __future__ import annotations

import contextlib
import copy
import shutil
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from django.conf import settings

from scripted_model import ScriptedModel
from tests.mariadb import mariadb  # noqa: F401 - the fixture, for every test
from tests.processes import (
    PYTHON,
    child_process,
    free_port,
    output_of,
    wait_http,
    web_process,
    worker_database_url,
)
from tests.secrets_vault import leak_scan

PAW_AGENT = "paw-agent serve"
HARNESS = "python-agent-harness serve"
SCRIPTED_API_KEY = "sk-scripted-test-key"


# --- The test database ------------------------------------------------------------------


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker) -> None:
    """The test database, emptied once before the first test. It is kept between sessions
    (``--reuse-db``), and each transactional test empties it after itself; a session
    killed mid-test (Ctrl-C twice, a CI timeout) leaves its rows behind, and the next
    session would fail on them ("alice already exists")."""
    from django.core.management import call_command

    with django_db_blocker.unblock():
        call_command("flush", interactive=False, verbosity=0)


#: Attempts at emptying the database after a transactional test, and the pause between.
FLUSH_ATTEMPTS = 5
FLUSH_RETRY_SECONDS = 0.5


@pytest.fixture(scope="session", autouse=True)
def _flush_retried() -> Iterator[None]:
    """Empty the database after a transactional test even when a worker is writing.

    A test may end while a run it started is still executing: the session's worker node
    (a separate process, started by an earlier test, consuming the shared ``runs`` queue)
    takes every run a test enqueues, and its transaction can deadlock with the flush's
    ``TRUNCATE`` (PostgreSQL aborts one of the two) or hold the pool's connections. A
    failed flush left the test's rows behind and failed the next test ("alice already
    exists", CI). Django's flush is retried a few times; the worker's writes then fail
    on the emptied tables' foreign keys, which the pipeline logs and drops."""
    from django.core.management.base import CommandError
    from django.db import connections
    from django.test import TransactionTestCase

    flush = TransactionTestCase._fixture_teardown

    def flush_retried(self) -> None:
        for attempt in range(1, FLUSH_ATTEMPTS + 1):
            try:
                return flush(self)
            except CommandError as exc:
                if attempt == FLUSH_ATTEMPTS:
                    raise
                print(f"flush failed ({exc.__cause__!r}); retrying ({attempt})")
                for connection in connections.all(initialized_only=True):
                    connection.close()
                time.sleep(FLUSH_RETRY_SECONDS * attempt)

    TransactionTestCase._fixture_teardown = flush_retried
    yield
    TransactionTestCase._fixture_teardown = flush


# --- Websocket test clients --------------------------------------------------------------

#: Seconds a test's websocket client waits, by default, for its connection and for each
#: message: channels' default (1 s) is a timed assertion on a loaded machine (a connect took
#: 1.04 s on CI-like load, failing a test whose subject was not speed). What a test expects
#: *not* to arrive it checks with ``receive_nothing``, which this leaves alone.
WEBSOCKET_WAIT_SECONDS = 10.0


@pytest.fixture(scope="session", autouse=True)
def _patient_websocket_clients() -> Iterator[None]:
    """Give ``WebsocketCommunicator.connect``, ``receive_from`` and ``receive_json_from``
    :data:`WEBSOCKET_WAIT_SECONDS` when a test passes no timeout of its own."""
    import functools

    from channels.testing import WebsocketCommunicator

    def patient(method):
        @functools.wraps(method)
        async def call(self, *args, **kwargs):
            if not args:
                kwargs.setdefault("timeout", WEBSOCKET_WAIT_SECONDS)
            return await method(self, *args, **kwargs)

        return call

    patch = pytest.MonkeyPatch()
    for name in ("connect", "receive_from", "receive_json_from"):
        patch.setattr(WebsocketCommunicator, name, patient(getattr(WebsocketCommunicator, name)))
    yield
    patch.undo()


# --- The secret scan --------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _secret_scan_installed() -> Iterator[None]:
    """Record what PAW sends and learn the secret values, for the whole session; what
    arrives after the last test is checked at the end."""
    undo = leak_scan.install()
    leak_scan.remember(SCRIPTED_API_KEY)
    try:
        yield
        leak_scan.SCAN.check()
    finally:
        undo()


@pytest.fixture(autouse=True)
def secret_scan(_secret_scan_installed) -> Iterator[leak_scan.SecretScan]:
    """The scan of this test (every test has it). What the test and its fixtures received
    is checked when the test's body ends (a failure of the test) and again after its
    fixtures' teardown. A test that leaks on purpose takes its leaks with
    ``secret_scan.take()``."""
    yield leak_scan.SCAN
    leak_scan.SCAN.check()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """A leak in what a test received fails the test itself (not only its teardown)."""
    __tracebackhide__ = True
    result = yield
    leak_scan.SCAN.check()
    return result


@pytest.fixture(autouse=True)
def _own_channel_layer(settings):
    """A channel layer of each test's own. channels-redis keeps asyncio locks on its layer
    object; one left behind by a socket closed in an earlier test's (now closed) event
    loop stalls every later receive of the process ("bound to a different event loop").
    Channels builds a new layer whenever ``CHANNEL_LAYERS`` changes, so each test gets a
    fresh one."""
    settings.CHANNEL_LAYERS = copy.deepcopy(settings.CHANNEL_LAYERS)


# --- Datasource servers -----------------------------------------------------------------


@pytest.fixture(scope="session")
def mariadb_url() -> str:
    """A MariaDB server's URL (``PAW_TEST_MARIADB_URL``, or a private server started for
    the session when nothing answers there); skips the test, saying why, without one."""
    from tests.pawenv import mariadb_url as url

    return url()


# --- The scripted model and the worker -----------------------------------------------------


@pytest.fixture(scope="session")
def scripted_model() -> Iterator[ScriptedModel]:
    """The scripted OpenAI-compatible model (one server for the session; each test loads
    its own script with ``scripted_model.load(...)``)."""
    with ScriptedModel({"responses": [], "api_key": SCRIPTED_API_KEY}) as model:
        yield model


class WorkerNode:
    """A real Celery worker process; ``use(command, **env)`` (re)starts it as needed.

    ``name`` is its node name (``PAW_NODE_NAME``, default this session's; its own
    ``sandbox.<name>`` queue) and ``concurrency`` its number of threads."""

    def __init__(
        self,
        database_url: str,
        model: ScriptedModel,
        *,
        name: str | None = None,
        concurrency: int = 8,
    ) -> None:
        self.database_url = database_url
        self.model = model
        self.name = name or settings.PAW_NODE_NAME
        self.concurrency = concurrency
        self.config: tuple | None = None
        self.process = None
        self._stack = ExitStack()

    @property
    def hostname(self) -> str:
        """The Celery hostname of the node (``paw@<name>``)."""
        return f"paw@{self.name}"

    def use(self, command: str = PAW_AGENT, **env: str) -> WorkerNode:
        config = (command, tuple(sorted(env.items())))
        if config != self.config or self.process is None or self.process.poll() is not None:
            self.stop()
            self._start(command, env)
            self.config = config
        return self

    def _start(self, command: str, extra_env: dict[str, str]) -> None:
        from paw_project.celery import app
        from sandboxes.enqueue import node_queues

        argv = [
            PYTHON, "-m", "celery", "-A", "paw_project", "worker", "--pool", "threads",
            "--concurrency", str(self.concurrency), "-n", self.hostname,
            "-Q", ",".join(node_queues(self.name)),
            "--loglevel", "INFO", "--without-mingle", "--without-gossip",
        ]  # fmt: skip
        env = {
            "PAW_DATABASE_URL": self.database_url,
            "PAW_NODE_NAME": self.name,
            "PAW_HARNESS_CMD": command,
            "PAW_LLM_BASE_URL": self.model.base_url,
            "PAW_LLM_API_KEY": SCRIPTED_API_KEY,
            "PAW_LLM_MODEL": "scripted-model",
            # The offline demo's provider, on the same scripted model (listed last).
            "PAW_DEMO_BASE_URL": self.model.base_url,
            # A runtime other than paw-agent (python-agent-harness, the fake one) runs its
            # tools without asking: PAW runs it only when told so. A test of that refusal
            # passes PAW_ALLOW_UNGATED_RUNTIME="0".
            **({} if command == PAW_AGENT else {"PAW_ALLOW_UNGATED_RUNTIME": "1"}),
            **extra_env,
        }
        if shutil.which("bwrap") is None and "PAW_SANDBOX_ISOLATION" not in env:
            # A machine without bubblewrap (PAW_TEST_ALLOW_NO_BWRAP=1): with Redis, a node
            # without it starts only when told to run sandboxes without a jail.
            env["PAW_SANDBOX_ISOLATION"] = "none"
        self._stack = ExitStack()
        self.process = self._stack.enter_context(child_process(argv, env=env))
        deadline = time.monotonic() + 60
        while not app.control.ping(destination=[self.hostname], timeout=0.5):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"worker node {self.name} did not start:\n{output_of(self.process)}"
                )

    def output(self) -> str:
        return output_of(self.process) if self.process else ""

    def stop(self) -> None:
        self._stack.close()
        self.process = None
        self.config = None


@pytest.fixture(scope="session")
def worker_node(django_db_setup, django_db_blocker, scripted_model) -> Iterator[WorkerNode]:
    with django_db_blocker.unblock():
        node = WorkerNode(worker_database_url(), scripted_model)
    yield node
    node.stop()


class WebServer:
    """A web process: ``base`` is its address, ``output()`` what it logged."""

    def __init__(self, process, port: int) -> None:
        self.process = process
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def output(self) -> str:
        return output_of(self.process)


@contextlib.contextmanager
def web_server(django_db_blocker, worker_node: WorkerNode, **env: str) -> Iterator[WebServer]:
    """The web process (``python -m paw_project.web``) serving PAW on the test database and
    Redis, with the same default provider (the scripted model) as the worker node, and the
    demo provider pointing at it too;
    ``env`` adds or overrides settings. A real stack with ``worker_node`` (module-scoped
    fixtures use it: ``chat_server``, the client's ``paw_server``)."""
    port = free_port()
    with django_db_blocker.unblock():
        database_url = worker_database_url()
    env = {
        "PAW_DATABASE_URL": database_url,
        "PAW_LLM_BASE_URL": worker_node.model.base_url,
        "PAW_LLM_API_KEY": SCRIPTED_API_KEY,
        "PAW_LLM_MODEL": "scripted-model",
        "PAW_DEMO_BASE_URL": worker_node.model.base_url,
        **env,
    }
    with web_process(port, **env) as process:
        wait_http(f"http://127.0.0.1:{port}/healthz", process=process)
        yield WebServer(process, port)


@pytest.fixture(autouse=True)
def _scripted_default_provider(request: pytest.FixtureRequest) -> None:
    """Tests that use the worker validate runs (here, on the web side) against the same
    default provider the worker gives its sandboxes: the scripted model."""
    if "worker_node" in request.fixturenames:
        settings = request.getfixturevalue("settings")
        model = request.getfixturevalue("scripted_model")
        settings.PAW_LLM_BASE_URL = model.base_url
        settings.PAW_LLM_API_KEY = SCRIPTED_API_KEY
        settings.PAW_LLM_MODEL = "scripted-model"
        settings.PAW_DEMO_BASE_URL = model.base_url


@pytest.fixture
def celery_worker(worker_node: WorkerNode) -> WorkerNode:
    """The worker node running ``paw-agent serve`` (the default runtime)."""
    return worker_node.use()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A failing test that used the worker shows the end of the worker's log."""
    report = yield
    node = getattr(item, "funcargs", {}).get("worker_node")
    if report.failed and isinstance(node, WorkerNode) and node.process is not None:
        report.sections.append(("celery worker log (last 6000 chars)", node.output()[-6000:]))
    return report


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


def use_up_throttle(scope: str, ident: str, rate: str) -> None:
    """Count requests of ``ident`` in ``scope`` until ``rate`` (e.g. ``"30/min"``) refuses
    the next one: the throttle store is shared with the servers the tests start."""
    from paw_project.throttles import rate_hit

    while rate_hit(rate, scope, ident) is None:
        pass


@pytest.fixture(autouse=True)
def _bearer_failures_forgotten() -> None:
    """Every test starts with no failed bearer authentication counted for the test
    clients' addresses (127.0.0.1; none at all for a ``WebsocketCommunicator``'s scope):
    many tests check that a revoked or expired token gets 401, and past
    ``PAW_THROTTLE_BAD_TOKENS`` within a minute the next ones would get 429 instead."""
    from accounts.services import BEARER_FAILURE_SCOPE
    from paw_project.throttles import rate_reset

    for address in ("127.0.0.1", ""):
        rate_reset(BEARER_FAILURE_SCOPE, address)


@pytest.fixture
def registration_open(settings) -> None:
    """Self-service sign-up open (closed by default outside the embedded mode)."""
    settings.PAW_ALLOW_REGISTRATION = True


@pytest.fixture
def reset_throttles():
    """Forget the per-IP auth throttle counter of the test client's 127.0.0.1, before and
    after the test. Only that counter is removed: the shared Redis database also holds the
    Celery broker's queues. (Per-user counters need no reset: user ids are never reused.)"""
    from paw_project.throttles import rate_reset

    def reset() -> None:
        rate_reset("auth", "127.0.0.1")

    reset()
    yield reset
    reset()
