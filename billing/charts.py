"""Server-side chart geometry for the usage page: plain numbers a template turns into SVG
(no JavaScript, no chart library)."""

from __future__ import annotations

import math
from typing import Any

#: Drawing area around the bars, in SVG user units (px at 100 % zoom).
MARGIN_LEFT = 56
MARGIN_RIGHT = 8
MARGIN_TOP = 10
MARGIN_BOTTOM = 26


def short_number(value: float) -> str:
    """``1234`` → ``1.2k``, ``2500000`` → ``2.5M``, ``2.5`` → ``2.5``: axis labels that
    fit."""
    for limit, suffix in ((1_000_000_000, "G"), (1_000_000, "M"), (1_000, "k")):
        if value >= limit:
            text = f"{value / limit:.1f}".rstrip("0").rstrip(".")
            return f"{text}{suffix}"
    return f"{value:g}"


def nice_ceiling(value: int) -> int:
    """The smallest of 1, 2, 2.5, 5 × 10ⁿ (an integer ≥ 1) that is ≥ ``value``: a round
    top for the axis."""
    if value <= 1:
        return 1
    magnitude = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        top = step * magnitude
        if top >= value and top == int(top):
            return int(top)
    return 10 * magnitude


def daily_bar_chart(
    daily: list[dict[str, Any]], *, width: int = 720, height: int = 220
) -> dict[str, Any]:
    """Geometry of a bar chart of tokens per day.

    ``daily``: ``[{"date": date, "tokens": int, ...}]`` in order. Returns ``{"width",
    "height", "top": int (tokens at the axis top), "bars": [{"x", "y", "width", "height",
    "date", "tokens"}], "ticks": [{"y", "label"}] (y axis), "labels": [{"x", "label"}]
    (x axis: at most ~8 dates), "baseline": y of the axis}``. Coordinates are SVG user
    units, rounded to 0.1.
    """
    plot_width = width - MARGIN_LEFT - MARGIN_RIGHT
    plot_height = height - MARGIN_TOP - MARGIN_BOTTOM
    baseline = MARGIN_TOP + plot_height
    top = nice_ceiling(max((day["tokens"] for day in daily), default=0))
    slot = plot_width / max(len(daily), 1)
    bar_width = max(slot * 0.7, 1.0)
    bars = []
    for index, day in enumerate(daily):
        bar_height = plot_height * day["tokens"] / top
        if day["tokens"] and bar_height < 1:
            bar_height = 1.0  # a day with any usage stays visible
        bars.append(
            {
                "x": round(MARGIN_LEFT + index * slot + (slot - bar_width) / 2, 1),
                "y": round(baseline - bar_height, 1),
                "width": round(bar_width, 1),
                "height": round(bar_height, 1),
                "date": day["date"],
                "tokens": day["tokens"],
            }
        )
    # Tokens are whole: a half-way tick only when it is a whole number (not 0.5 of 1).
    fractions = (0, 0.5, 1) if top % 2 == 0 else (0, 1)
    ticks = [
        {"y": round(baseline - plot_height * fraction, 1), "label": short_number(top * fraction)}
        for fraction in fractions
    ]
    every = max(1, math.ceil(len(daily) / 8))
    labels = [
        {
            "x": round(MARGIN_LEFT + index * slot + slot / 2, 1),
            "label": f"{day['date']:%b} {day['date'].day}",
        }
        for index, day in enumerate(daily)
        if index % every == 0
    ]
    return {
        "width": width,
        "height": height,
        "top": top,
        "bars": bars,
        "ticks": ticks,
        "labels": labels,
        "baseline": baseline,
        "left": MARGIN_LEFT,
        "right": width - MARGIN_RIGHT,
    }
