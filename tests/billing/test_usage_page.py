"""The usage page: signed-in people only; the month's totals against the budget, a daily
chart drawn on the server as SVG, and a table per model."""

from __future__ import annotations

import re

import pytest
from django.test import Client
from django.utils import timezone

from billing.charts import daily_bar_chart, nice_ceiling, short_number
from tests.billing.ledger import at, ledger_event
from tests.conftest import PASSWORD

pytestmark = pytest.mark.django_db


@pytest.fixture
def browser(user) -> Client:
    client = Client()
    assert client.login(username=user.username, password=PASSWORD)
    return client


def bars(content: bytes) -> list[dict[str, float]]:
    return [
        {"y": float(m[1]), "height": float(m[2])}
        for m in re.finditer(
            rb'<rect class="usage-chart-bar" x="[\d.]+" y="([\d.]+)" width="[\d.]+" height="([\d.]+)"',
            content,
        )
    ]


def test_the_usage_page_needs_a_sign_in(db):
    response = Client().get("/usage/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")


def test_the_page_shows_the_month_against_the_budget_with_a_chart_and_models(
    browser, user, other_user, settings
):
    settings.PAW_BUDGET_MONTHLY_TOKENS = 10_000
    ledger_event(user=user, input_tokens=2000, output_tokens=500, model="model-a")
    ledger_event(user=user, input_tokens=400, output_tokens=100, model="model-b")
    ledger_event(user=other_user, input_tokens=99_999, model="model-z")
    response = browser.get("/usage/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'href="/static/paw/billing.css"' in html
    assert re.search(r'<meter id="budget-meter" min="0" max="10000" value="3000"', html)
    assert "3,000</strong> of" in html and "10,000</span> tokens used (30%)" in html
    # One bar per day of the month; today's (the only one with tokens) is the tallest.
    now = timezone.now()
    drawn = bars(response.content)
    assert '<svg viewBox="0 0 720 220" role="img"' in html
    days_in_month = len(response.context["report"]["daily"])
    assert len(drawn) == days_in_month >= 28
    assert [b["height"] > 0 for b in drawn].count(True) == 1
    assert drawn[now.day - 1]["height"] == max(b["height"] for b in drawn)
    assert f"{now:%Y-%m-%d}: 3,000 tokens" in html
    models = re.findall(r'<th scope="row">(model-[a-z])</th>', html)
    assert models == ["model-a", "model-b"]
    assert "model-z" not in html and "99,999" not in html


def test_an_earlier_month_can_be_shown(browser, user):
    ledger_event(user=user, input_tokens=70, created=at("2026-02-14T08:00:00"))
    response = browser.get("/usage/?month=2026-02")
    assert response.status_code == 200
    drawn = bars(response.content)
    assert len(drawn) == 28
    assert [i for i, b in enumerate(drawn) if b["height"] > 0] == [13]
    assert response.context["report"]["totals"]["tokens"] == 70
    assert b"budget-meter" not in response.content  # the budget is this month's only


def test_chart_geometry_keeps_bars_inside_and_scales_to_a_round_top():
    days = [{"date": at("2026-06-01T00:00:00").date(), "tokens": t} for t in (0, 1, 730, 365)]
    chart = daily_bar_chart(days, width=400, height=200)
    assert chart["top"] == 1000
    heights = [b["height"] for b in chart["bars"]]
    assert heights[0] == 0 and heights[1] >= 1  # a day with any usage stays visible
    assert heights[2] == pytest.approx(2 * heights[3], abs=0.2)
    for bar in chart["bars"]:
        assert bar["y"] + bar["height"] == pytest.approx(chart["baseline"], abs=0.11)
        assert chart["left"] <= bar["x"] and bar["x"] + bar["width"] <= chart["right"]
    assert [nice_ceiling(v) for v in (0, 1, 3, 7, 24, 26, 999, 1001)] == [
        1,
        1,
        5,
        10,
        25,
        50,
        1000,
        2000,
    ]
    assert [short_number(v) for v in (0, 2.5, 999, 1500, 2_000_000)] == [
        "0",
        "2.5",
        "999",
        "1.5k",
        "2M",
    ]
