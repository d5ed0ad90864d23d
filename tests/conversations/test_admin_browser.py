"""The admin's wide change list in a real browser (Debian's Chromium): the usage ledger's
table scrolls sideways in its own box, the page keeps the window's width."""

from __future__ import annotations

import pytest

from tests.billing.ledger import ledger_event

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


@pytest.mark.parametrize("width", [1024, 390])
def test_the_usage_ledger_fits_the_window_and_its_table_scrolls(browser_session, make_user, width):
    operator = make_user("ledger-operator", is_staff=True, is_superuser=True)
    for n in range(3):
        ledger_event(
            user=operator,
            input_tokens=123_456_789,
            output_tokens=98_765,
            provider="a-custom-provider-with-a-long-name",
            model=f"a-very-long-model-name-{n}-with-its-version-2026-12-01-preview",
        )
    browser_session.sign_in_as(operator)
    page = browser_session.page
    page.set_viewport_size({"width": width, "height": 900})
    page.goto(browser_session.url("/admin/billing/usageevent/"))
    page.wait_for_selector("#result_list")
    sizes = page.evaluate(
        """() => {
          const box = document.querySelector('#changelist-form .results');
          return {page: document.documentElement.scrollWidth, window: window.innerWidth,
                  box: box.clientWidth, table: box.scrollWidth,
                  scrolls: getComputedStyle(box).overflowX};
        }"""
    )
    assert sizes["page"] <= sizes["window"], sizes  # no sideways scrolling of the page
    assert sizes["scrolls"] == "auto", sizes
    assert sizes["table"] > sizes["box"], sizes  # the table is wider: its box scrolls
