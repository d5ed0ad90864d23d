"""Fixtures of the client's tests: a real PAW stack (a Daphne process from
``tests.conftest.web_server``, the real Celery worker node running paw-agent, the scripted
model), people with personal API tokens, and a TCP proxy a test can cut mid-run."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

import pytest

from accounts.models import User
from accounts.services import personal_token_create
from tests.conftest import PASSWORD, WebServer, web_server
from tests.processes import ROOT

TIPS = ROOT / "sample_data" / "tips.csv"


@pytest.fixture(scope="module")
def paw_server(django_db_setup, django_db_blocker, worker_node) -> Iterator[WebServer]:
    """PAW's web process for the client tests (uploads and runs not throttled in practice;
    the auth throttle high enough for the logins the tests make)."""
    with web_server(
        django_db_blocker,
        worker_node,
        PAW_THROTTLE_AUTH="1000/min",
        PAW_THROTTLE_UPLOADS="1000/min",
    ) as server:
        yield server


@pytest.fixture
def stack(paw_server, celery_worker, reset_throttles) -> WebServer:
    """The whole stack: web process and worker node (paw-agent under the scripted model).
    The per-address auth throttle's counter is reset around each test: the shared cache
    would otherwise charge these tests' logins to the next module's web server."""
    return paw_server


class Person:
    """A user with a personal API token (``token``) and a password (``PASSWORD``)."""

    def __init__(self, username: str) -> None:
        self.user = User.objects.create_user(username=username, password=PASSWORD)
        self.username = username
        self.password = PASSWORD
        _, self.token = personal_token_create(user=self.user, name="tests")


@pytest.fixture
def person(db) -> Person:
    return Person("ada")


class CuttableProxy:
    """A TCP proxy on 127.0.0.1 in front of ``port``; :meth:`cut` breaks every
    connection going through it at once (as a lost network does), new ones still pass.
    ``connections`` counts the connections made through it."""

    def __init__(self, port: int) -> None:
        self.target = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.base = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self._open: list[socket.socket] = []
        self._lock = threading.Lock()
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self._lock:
                self.connections += 1
                self._open += [client, upstream]
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self._lock:
            sockets, self._open = self._open, []
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def close(self) -> None:
        self._stopped = True
        self.listener.close()
        self.cut()


@pytest.fixture
def proxy(stack) -> Iterator[CuttableProxy]:
    cuttable = CuttableProxy(stack.port)
    yield cuttable
    cuttable.close()
