"""The model picker with nothing but the offline demo (as after `make run` without a key):
the demo is listed once, as the automatic choice, not a second time as its own group."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import WebServer, web_server
from tests.conversations.conftest import BrowserSession

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]


@pytest.fixture(scope="module")
def demo_only_server(django_db_setup, django_db_blocker, worker_node) -> Iterator[WebServer]:
    with web_server(
        django_db_blocker, worker_node, PAW_LLM_BASE_URL="", PAW_LLM_API_KEY="", PAW_LLM_MODEL=""
    ) as server:
        yield server


def test_the_demo_is_listed_once_when_it_is_the_only_provider(
    chromium, demo_only_server, celery_worker, make_user
):
    context = chromium.new_context(viewport={"width": 1280, "height": 900})
    try:
        session = BrowserSession(context, demo_only_server)
        session.sign_in_as(make_user("newcomer"))
        page = session.page
        page.goto(session.url("/"))
        page.wait_for_function("() => document.querySelectorAll('#model-picker option').length > 1")
        options = page.eval_on_selector_all(
            "#model-picker option", "(nodes) => nodes.map((n) => n.textContent)"
        )
        groups = page.eval_on_selector_all(
            "#model-picker optgroup", "(nodes) => nodes.map((n) => n.label)"
        )
        assert options[0] == "Automatic: Scripted demo (no AI) (scripted-demo)", options
        assert [o for o in options if "scripted-demo" in o] == [options[0]], options
        assert not [g for g in groups if g.startswith("Scripted demo")], groups
        assert page.locator("#demo-banner").is_visible()
    finally:
        context.close()
