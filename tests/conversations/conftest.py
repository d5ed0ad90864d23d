"""Fixtures of the browser tests: a real web process (uvicorn, as production) serving the chat page, Debian's
Chromium driven by Playwright, and a page that leaves a screenshot and its console log
in ``test-artifacts/`` when its test fails."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import WebServer, web_server
from tests.processes import ROOT
from tests.sandboxes.scenarios import FAKE

CHROMIUM = "/usr/bin/chromium"
#: The chat server's upload limit (bytes): small, so "too large" is cheap to test.
UPLOAD_LIMIT = 1024 * 1024
ARTIFACTS = ROOT / "test-artifacts"
# What the machine's closed network needs (no background fetches) and root needs (no
# sandbox): see docs/development.md, *What the tests use*.
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def fake_worker(worker_node):
    """The session's worker node running the suite's scripted runtime
    (``tests/sandboxes/fake_runtime.py``, no jail): its mode comes from the workspace."""
    return worker_node.use(FAKE, PAW_SANDBOX_ISOLATION="none")


@pytest.fixture(scope="module")
def chat_server(django_db_setup, django_db_blocker, worker_node) -> Iterator[WebServer]:
    """The web process serving PAW (see ``tests.conftest.web_server``), with a small upload
    limit and sign-up open (closed by default outside the embedded mode)."""
    with web_server(
        django_db_blocker,
        worker_node,
        PAW_ALLOW_REGISTRATION="1",
        PAW_MAX_UPLOAD_BYTES=str(UPLOAD_LIMIT),
        PAW_THROTTLE_UPLOADS="1000/min",
        PAW_THROTTLE_FORKS="1000/min",
        PAW_THROTTLE_RUNS="1000/min",
    ) as server:
        yield server


@pytest.fixture(scope="module")
def chromium(django_db_setup):
    """Debian's Chromium, headless, through Playwright (no browser download).

    Playwright's sync API keeps an event loop running on this thread, which Django takes
    for an async context: while the browser is open, the ORM calls of these tests (and of
    pytest-django's flushes) are allowed with ``DJANGO_ALLOW_ASYNC_UNSAFE`` (as
    pytest-playwright's docs advise). Module scope keeps that to the browser tests."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (.ci/run does).")
    from playwright.sync_api import sync_playwright

    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """Remember each phase's report on the item, so fixtures can see a failure."""
    report = yield
    setattr(item, f"report_{report.when}", report)
    return report


class BrowserSession:
    """A browser context signed in (or not) against the chat server; ``console`` holds
    every console message and page error of its pages."""

    def __init__(self, context, server: WebServer) -> None:
        self.context = context
        self.server = server
        self.console: list[str] = []
        self.page = self.new_page()

    def new_page(self):
        page = self.context.new_page()
        page.set_default_timeout(30_000)
        page.on("console", lambda m: self.console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: self.console.append(f"pageerror: {e}"))
        return page

    def url(self, path: str) -> str:
        return self.server.base + path

    def sign_in_as(self, user) -> None:
        """Start a signed-in session for ``user`` (a session cookie made by Django)."""
        from django.test import Client

        client = Client()
        client.force_login(user)
        self.context.add_cookies(
            [
                {
                    "name": "sessionid",
                    "value": client.cookies["sessionid"].value,
                    "url": self.server.base,
                }
            ]
        )


def keep_failure_artifacts(request, context, session: BrowserSession, logs: dict[str, str]) -> None:
    """When the test of ``request`` failed (setup or call): a screenshot of each page of
    ``context``, the ``session``'s console, and each of ``logs`` (``name → text``, the
    servers' output) into ``test-artifacts/``."""
    failed = any(
        getattr(getattr(request.node, f"report_{when}", None), "failed", False)
        for when in ("setup", "call")
    )
    if not failed:
        return
    ARTIFACTS.mkdir(exist_ok=True)
    name = re.sub(r"[^\w.-]+", "_", request.node.nodeid)
    for index, page in enumerate(context.pages):
        try:
            page.screenshot(path=str(ARTIFACTS / f"{name}-{index}.png"), full_page=True)
        except Exception as error:  # a crashed page cannot be shot; say so
            session.console.append(f"(no screenshot of page {index}: {error})")
    (ARTIFACTS / f"{name}.console.log").write_text("\n".join(session.console) + "\n")
    for log, text in logs.items():
        (ARTIFACTS / f"{name}.{log}.log").write_text(text[-20000:])


@pytest.fixture
def browser_session(request, chromium, chat_server, celery_worker) -> Iterator[BrowserSession]:
    context = chromium.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    session = BrowserSession(context, chat_server)
    yield session
    keep_failure_artifacts(request, context, session, {"server": chat_server.output()})
    context.close()
