"""The chat on a phone (390×844: the transcript gets the screen, the header folds, the
model picker's text is whole, the conversation list is a drawer with a backdrop) and
axe-core's check of PAW's pages in light and dark, in a real browser (Debian's Chromium
through Playwright; axe-core from the npm registry, see ``tests/conversations/axe.py``)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from accounts.models import User
from billing.models import Budget
from conversations.models import Conversation, Share
from conversations.services.shares import share_create
from conversations.services.workspaces import workspace_ensure
from secrets_vault.models import CustomProvider
from tests.conftest import PASSWORD
from tests.conversations.axe import axe_violations
from tests.conversations.conftest import BrowserSession, keep_failure_artifacts
from tests.conversations.test_api_export import PNG
from tests.conversations.test_api_shares import add_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow, pytest.mark.browser]

PHONE = {"width": 390, "height": 844}
#: A model name as long as real ones get (a custom provider's, as vLLM or LiteLLM list them).
LONG_MODEL = "meta-llama/Llama-3.3-70B-Instruct-Turbo"
TITLE = "Tips by weekday"


@pytest.fixture
def alice(db) -> User:
    """A user with a monthly budget (the usage badge and page show it)."""
    user = User.objects.create_user(username="alice", password=PASSWORD)
    Budget.objects.create(user=user, monthly_tokens=1_000_000)
    return user


@pytest.fixture
def phone(request, chromium, chat_server, celery_worker) -> Iterator[BrowserSession]:
    """A browser session in a phone's viewport (390×844, touch, a mobile viewport)."""
    context = chromium.new_context(viewport=PHONE, is_mobile=True, has_touch=True)
    session = BrowserSession(context, chat_server)
    yield session
    keep_failure_artifacts(request, context, session, {"server": chat_server.output()})
    context.close()


def open_chat(session: BrowserSession, user, **fields) -> Conversation:
    session.sign_in_as(user)
    conversation = Conversation.objects.create(user=user, title=TITLE, **fields)
    session.page.goto(session.url(f"/c/{conversation.id}/"))
    session.page.wait_for_selector(".connection[data-state=connected]")
    session.page.wait_for_selector("#model-picker option:not([value=''])", state="attached")
    return conversation


def box(page, selector: str) -> dict:
    return page.locator(selector).bounding_box()


def test_on_a_phone_the_transcript_gets_the_screen_and_the_header_folds(phone, alice):
    page = phone.page
    open_chat(phone, alice, llm_provider="demo")  # the demo's banner shows too
    page.wait_for_selector("#demo-banner:not([hidden])")
    transcript = box(page, "#transcript")
    assert transcript["height"] / PHONE["height"] >= 0.7, transcript
    # Folded: the header is one line of controls, plus the banner's one line.
    head = box(page, ".conversation-head")
    assert head["height"] <= 80, head
    toggle, more = box(page, "#sidebar-toggle"), box(page, "#head-more")
    assert abs(toggle["y"] - more["y"]) < 2  # the same line
    assert page.locator("h1").inner_text() == TITLE
    assert page.evaluate(
        "() => { const h = document.querySelector('h1'); return h.scrollWidth <= h.clientWidth; }"
    )
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    for hidden in (
        "#model-picker",
        "#auto-approve",
        "#delete-conversation",
        "#rename-conversation",
    ):
        assert not page.locator(hidden).is_visible(), hidden
    banner = page.locator("#demo-banner")
    assert banner.evaluate("(b) => b.getBoundingClientRect().height") < 30  # one line
    assert page.locator(".files").evaluate("(f) => f.open") is False

    # "More" unfolds the rest, and folds it again.
    page.get_by_role("button", name="More").tap()
    assert page.get_by_role("button", name="More").get_attribute("aria-expanded") == "true"
    for shown in ("#model-picker", "#auto-approve", "#delete-conversation", "#rename-conversation"):
        assert page.locator(shown).is_visible(), shown
    assert "Upload a CSV" in banner.inner_text()
    assert page.evaluate(
        "() => { const h = document.querySelector('h1'); return h.scrollWidth <= h.clientWidth; }"
    )
    assert page.evaluate("() => document.documentElement.scrollWidth") <= PHONE["width"]
    page.get_by_role("button", name="More").tap()
    assert not page.locator("#model-picker").is_visible()
    assert page.get_by_role("button", name="More").get_attribute("aria-expanded") == "false"


SHOWN_TEXT = """() => {
    const select = document.getElementById("model-picker");
    const style = getComputedStyle(select);
    const context = document.createElement("canvas").getContext("2d");
    context.font = style.font;
    const rect = select.getBoundingClientRect();
    return {
        text: select.options[select.selectedIndex].text,
        textWidth: context.measureText(select.options[select.selectedIndex].text).width,
        inner: select.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight),
        left: rect.left, right: rect.right, viewport: window.innerWidth,
    };
}"""
#: Room Chromium keeps for a select's arrow, inside its padding box (px).
ARROW = 16


@pytest.mark.parametrize("where", ["phone", "desktop"])
def test_the_model_pickers_text_is_never_cut(request, chromium, where):
    # The browser first: started after the user was made, Playwright's event loop would
    # leave Django on another connection than the one that made them.
    session = request.getfixturevalue("phone" if where == "phone" else "browser_session")
    alice = request.getfixturevalue("alice")
    # A custom provider whose live model list cannot be read (nothing listens): its
    # known model is offered.
    CustomProvider.objects.create(
        name="lab", label="Lab vLLM", base_url="http://127.0.0.1:9/v1", known_models=[LONG_MODEL]
    )
    open_chat(session, alice, llm_provider="lab", llm_model=LONG_MODEL)
    page = session.page
    if where == "phone":
        page.get_by_role("button", name="More").tap()
    page.wait_for_function(
        "(value) => document.getElementById('model-picker').value === value",
        arg=json.dumps(["lab", LONG_MODEL], separators=(",", ":")),
    )
    shown = page.evaluate(SHOWN_TEXT)
    assert shown["text"] == LONG_MODEL
    assert shown["textWidth"] + ARROW <= shown["inner"], shown
    assert shown["left"] >= 0 and shown["right"] <= shown["viewport"], shown


def test_the_drawer_has_a_backdrop_and_closes_on_escape_or_a_tap_outside(phone, alice):
    page = phone.page
    open_chat(phone, alice)
    menu = page.get_by_role("button", name="Your conversations")
    sidebar = page.locator("#sidebar")
    backdrop = page.locator("#drawer-backdrop")
    assert not sidebar.is_visible() and not backdrop.is_visible()

    menu.tap()
    assert sidebar.is_visible() and backdrop.is_visible()
    assert menu.get_attribute("aria-expanded") == "true"
    drawer = sidebar.bounding_box()
    assert drawer["width"] < PHONE["width"] * 0.9  # the page shows beside it, dimmed
    assert page.evaluate("() => document.activeElement.closest('#sidebar') !== null")
    assert page.evaluate("() => document.getElementById('main').inert")  # focus stays in it
    page.keyboard.press("Escape")
    assert not sidebar.is_visible() and not backdrop.is_visible()
    assert menu.get_attribute("aria-expanded") == "false"
    assert page.evaluate("() => document.activeElement.id") == "sidebar-toggle"

    # A tap outside, right on the "More" button behind the backdrop: it closes the drawer
    # and reaches nothing behind.
    menu.tap()
    more = page.locator("#head-more").bounding_box()
    page.touchscreen.tap(more["x"] + more["width"] / 2, more["y"] + more["height"] / 2)
    assert not sidebar.is_visible() and not backdrop.is_visible()
    assert page.locator("#head-more").get_attribute("aria-expanded") == "false"
    assert not page.locator("#model-picker").is_visible()
    assert not page.evaluate("() => document.getElementById('main').inert")


def test_in_the_drawer_titles_cut_to_the_same_text_are_shown_whole(phone, alice):
    """Laid out only when the drawer opens (hidden before): measured then."""
    from tests.conversations.test_chat_sidebar import assert_told_apart, item, titles_cut_alike

    page = phone.page
    march, april, alone = titles_cut_alike(alice)
    open_chat(phone, alice)
    item(page, alone).wait_for(state="attached")
    page.get_by_role("button", name="Your conversations").tap()
    assert page.locator("#sidebar").is_visible()
    # The drawer's first frame has been laid out (and observed).
    page.evaluate(
        "() => new Promise((done) => requestAnimationFrame(() => requestAnimationFrame(done)))"
    )
    assert_told_apart(page, march, april, alone)


# --- axe-core ---------------------------------------------------------------------------

PAGES = ["sign-in", "chat", "chat-phone", "usage", "keys", "share-dialog", "shared", "shared-by-me"]


def shared_conversation(user) -> Share:
    """A conversation of ``user`` with a finished run, its chart, shared with everyone."""
    conversation = Conversation.objects.create(user=user, title=TITLE)
    add_run(conversation, "Average tip?", "The average tip is **3.00**.")
    (workspace_ensure(conversation.id) / "chart.png").write_bytes(PNG)
    return share_create(user=user, conversation_id=conversation.id, audience="signed_in")


def axe_report(violations: list[dict]) -> str:
    return json.dumps(violations, indent=1)


@pytest.mark.parametrize("scheme", ["light", "dark"])
@pytest.mark.parametrize("name", PAGES)
def test_axe_finds_no_serious_violation(
    request, chromium, chat_server, celery_worker, alice, name, scheme
):
    phone = name == "chat-phone"
    context = chromium.new_context(
        viewport=PHONE if phone else {"width": 1280, "height": 900},
        is_mobile=phone,
        has_touch=phone,
        color_scheme=scheme,
    )
    session = BrowserSession(context, chat_server)
    page = session.page
    try:
        assert page.evaluate("() => matchMedia('(prefers-color-scheme: dark)').matches") == (
            scheme == "dark"
        )
        if name == "sign-in":
            page.goto(session.url("/accounts/login/"))
            page.get_by_label("Username").fill("alice")
            page.get_by_label("Password").fill("wrong")
            page.get_by_role("button", name="Sign in").click()
            page.get_by_role("alert").wait_for()  # the page with its error too
        elif name.startswith("chat"):
            open_chat(session, alice, llm_provider="demo")  # with the demo's banner
            page.wait_for_selector("#demo-banner:not([hidden])")
            page.locator("#usage-badge:not(:empty)").wait_for(state="attached")
            if phone:
                page.get_by_role("button", name="More").tap()
        elif name == "usage":
            session.sign_in_as(alice)
            page.goto(session.url("/usage/"))
        elif name == "keys":
            # With a key and a token made on the page (their tables and messages show).
            session.sign_in_as(alice)
            page.goto(session.url("/settings/keys/"))
            page.get_by_label("Name", exact=True).fill("WEATHER_TOKEN")
            page.get_by_label("Value", exact=True).fill("s3cret-value")
            page.get_by_role("button", name="Save").click()
            page.locator(".keys-table").first.wait_for()
            page.get_by_label("Token name").fill("laptop")
            page.get_by_role("button", name="Make a token").click()
            page.locator(".tokens-table").wait_for()
        elif name == "share-dialog":  # with a link made (the list shows it)
            open_chat(session, alice)
            page.get_by_role("button", name="Share", exact=True).click()
            page.get_by_role("button", name="Create link").click()
            page.locator("#share-list .share-item").wait_for()
        elif name == "shared":
            session.sign_in_as(alice)
            page.goto(session.url(f"/s/{shared_conversation(alice).id}/"))
            page.locator("#transcript[aria-busy=false] .answer").wait_for()
        elif name == "shared-by-me":
            session.sign_in_as(alice)
            shared_conversation(alice)
            page.goto(session.url("/shares/"))
            page.locator("#shares .share-item").wait_for()
        violations = axe_violations(page)
        assert violations == [], axe_report(violations)
        if phone:  # and with the drawer open
            page.get_by_role("button", name="Your conversations").tap()
            violations = axe_violations(page)
            assert violations == [], axe_report(violations)
    finally:
        keep_failure_artifacts(request, context, session, {"server": chat_server.output()})
        context.close()
