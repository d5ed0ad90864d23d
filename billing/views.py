"""The usage page (an edge: parse, read through selectors, render)."""

from __future__ import annotations

import re
from datetime import UTC, date, timedelta

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.utils import timezone

from billing.charts import daily_bar_chart
from billing.selectors import day_start, next_month_start, usage_report
from paw_project.security import content_security_policy

_MONTH = re.compile(r"^(\d{4})-(\d{2})$")


def _month(value: str | None) -> date:
    """The first day of ``?month=YYYY-MM``; the current month (UTC) when absent or bad."""
    match = _MONTH.match(value or "")
    if match and 1 <= int(match[2]) <= 12 and int(match[1]) >= 1:
        return date(int(match[1]), int(match[2]), 1)
    return timezone.now().astimezone(UTC).date().replace(day=1)


@content_security_policy
@login_required
def usage_page(request: HttpRequest) -> HttpResponse:
    """``/usage/[?month=YYYY-MM]``: the signed-in person's tokens of one calendar month
    (UTC): totals, the budget and the person's teams' budgets, a daily chart (server-rendered SVG), and tables by model
    and by conversation."""
    first = _month(request.GET.get("month"))
    last = next_month_start(day_start(first)).date() - timedelta(days=1)
    report = usage_report(user=request.user, date_from=first, date_to=last)
    previous = (first - timedelta(days=1)).replace(day=1)
    following = last + timedelta(days=1)
    this_month = timezone.now().astimezone(UTC).date().replace(day=1)
    budget = report["budget"]
    context = {
        "report": report,
        "month": first,
        "is_current_month": first == this_month,
        "previous_month": f"{previous:%Y-%m}",
        "next_month": f"{following:%Y-%m}" if following <= this_month else "",
        "chart": daily_bar_chart(report["daily"]),
        "budget": budget,
        "budget_left": max(budget["monthly_limit"] - budget["used_this_month"], 0),
        "team_budgets": [
            {
                **team,
                "left": max(team["monthly_limit"] - team["used_this_month"], 0),
                "percent": round(100 * team["used_this_month"] / team["monthly_limit"]),
            }
            for team in budget["teams"]
        ],
        "budget_percent": (
            round(100 * budget["used_this_month"] / budget["monthly_limit"])
            if budget["monthly_limit"]
            else None
        ),
    }
    return render(request, "billing/usage.html", context)
