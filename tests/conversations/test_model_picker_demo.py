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


#: The chosen option's text and the room the select gives it: on one line when it fits
#: (``textWidth`` + the arrow within ``inner``), else the height the text needs wrapped at
#: that width (``wrapped``, laid out by the browser in a hidden probe) beside the select's
#: content height (``content``).
SHOWN_WRAPPED = """(arrow) => {
    const select = document.getElementById("model-picker");
    const style = getComputedStyle(select);
    const text = select.options[select.selectedIndex].text;
    const context = document.createElement("canvas").getContext("2d");
    context.font = style.font;
    const inner = select.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const probe = document.createElement("div");
    probe.style.cssText = `position: absolute; visibility: hidden; white-space: normal; width: ${inner - arrow}px;
        font: ${style.font}; line-height: ${style.lineHeight}; overflow-wrap: normal;`;
    probe.textContent = text;
    document.body.append(probe);
    const wrapped = probe.getBoundingClientRect().height;
    probe.remove();
    const rect = select.getBoundingClientRect();
    return {
        text, textWidth: context.measureText(text).width, inner, wrapped,
        content: select.clientHeight - parseFloat(style.paddingTop) - parseFloat(style.paddingBottom),
        left: rect.left, right: rect.right, viewport: window.innerWidth,
    };
}"""


def test_on_a_phone_the_demos_automatic_choice_is_shown_whole(
    chromium, demo_only_server, celery_worker, make_user
):
    """The longest label the picker shows after `make run` ("Automatic: Scripted demo (no
    AI) (scripted-demo)") is wider than a phone's screen: under *More* it wraps onto a
    second line rather than being cut, within the screen."""
    from tests.conversations.test_phone_and_accessibility import ARROW, PHONE

    context = chromium.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    try:
        session = BrowserSession(context, demo_only_server)
        session.sign_in_as(make_user("newcomer"))
        page = session.page
        page.goto(session.url("/"))
        page.wait_for_function("() => document.querySelectorAll('#model-picker option').length > 1")
        page.get_by_role("button", name="More").tap()
        page.locator("#model-picker").wait_for()
        shown = page.evaluate(SHOWN_WRAPPED, ARROW)
        assert shown["text"] == "Automatic: Scripted demo (no AI) (scripted-demo)", shown
        assert shown["textWidth"] + ARROW > shown["inner"], shown  # one line cannot hold it
        assert shown["content"] >= shown["wrapped"] - 0.5, shown  # room for every line
        assert shown["left"] >= 0 and shown["right"] <= shown["viewport"], shown
        assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    finally:
        context.close()
