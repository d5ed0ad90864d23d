"""Reads of the usage ledger and of budgets.

Tokens are always input + output tokens. Months and days are calendar months and days in
UTC: a month starts on its first day at 00:00:00 UTC, whatever the server's time zone.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db.models import Count, F, QuerySet, Sum
from django.db.models.functions import Coalesce, TruncDate
from django.utils import timezone

from billing.models import Budget, TeamBudget, UsageEvent
from paw_project.demo import DEMO_PROVIDER_NAME
from paw_project.errors import Forbidden, InvalidRequest, NotFound
from teams.selectors import user_team_ids

#: Longest date range the usage report covers (days, both ends included).
MAX_RANGE_DAYS = 366

#: Input + output tokens of a ledger row, for aggregates.
TOKENS = F("input_tokens") + F("output_tokens")


@dataclass(frozen=True)
class BudgetLimits:
    """A user's budgets in tokens (input + output); ``0`` means unlimited."""

    monthly: int
    run: int


def month_start(at: datetime) -> datetime:
    """The first instant (UTC) of the calendar month, in UTC, that ``at`` falls in."""
    at = at.astimezone(UTC)
    return datetime(at.year, at.month, 1, tzinfo=UTC)


def next_month_start(at: datetime) -> datetime:
    """The first instant (UTC) of the calendar month after the one ``at`` falls in: when
    a monthly budget resets."""
    start = month_start(at)
    return datetime(start.year + start.month // 12, start.month % 12 + 1, 1, tzinfo=UTC)


def day_start(day: date) -> datetime:
    """``day`` at 00:00:00 UTC."""
    return datetime.combine(day, time.min, tzinfo=UTC)


def iso_utc(at: datetime) -> str:
    """``at`` as ISO 8601 in UTC with a ``Z`` (``2026-07-01T00:00:00Z``)."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def usage_is_demo(*, provider: str) -> bool:
    """Whether a run on ``provider`` is demo usage: the offline demo's scripted model
    (``paw_project.demo.DEMO_PROVIDER_NAME``, a name no custom provider may take),
    which costs nothing and so counts against no budget."""
    return provider == DEMO_PROVIDER_NAME


def budget_limits(*, user_id: int) -> BudgetLimits:
    """The user's budgets: their :class:`~billing.models.Budget` where set, else
    ``PAW_BUDGET_MONTHLY_TOKENS`` and ``PAW_BUDGET_RUN_TOKENS``. One query."""
    own = Budget.objects.filter(user_id=user_id).values("monthly_tokens", "run_tokens").first()
    own = own or {}
    monthly = own.get("monthly_tokens")
    run = own.get("run_tokens")
    return BudgetLimits(
        monthly=settings.PAW_BUDGET_MONTHLY_TOKENS if monthly is None else monthly,
        run=settings.PAW_BUDGET_RUN_TOKENS if run is None else run,
    )


def tokens_used(*, user_id: int, since: datetime, until: datetime | None = None) -> int:
    """Tokens (input + output) the user's finished runs used from ``since`` (inclusive)
    to ``until`` (exclusive; open-ended when ``None``), by the time the ledger row was
    written (the run's end), demo usage left out (it counts against no budget). One
    query."""
    events = UsageEvent.objects.filter(user_id=user_id, created__gte=since, demo=False)
    if until is not None:
        events = events.filter(created__lt=until)
    return events.aggregate(tokens=Coalesce(Sum(TOKENS), 0))["tokens"]


@dataclass(frozen=True)
class TeamLimit:
    """A team's monthly budget: ``team_id``, ``name``, ``monthly`` tokens (never 0 here:
    teams without a budget have no :class:`TeamLimit`)."""

    team_id: int
    name: str
    monthly: int


def team_limits(*, team_ids: frozenset[int] | set[int]) -> list[TeamLimit]:
    """The budgets of the teams ``team_ids`` that have one (``monthly_tokens`` over 0),
    by team name. One query (none for no team)."""
    if not team_ids:
        return []
    rows = (
        TeamBudget.objects.filter(team_id__in=team_ids, monthly_tokens__gt=0)
        .order_by("team__name")
        .values_list("team_id", "team__name", "monthly_tokens")
    )
    return [TeamLimit(team_id=t, name=name, monthly=limit) for t, name, limit in rows]


def user_team_limits(*, user_id: int) -> list[TeamLimit]:
    """The budgets of the teams the user ``user_id`` is a member of now (by name)."""
    user = get_user_model()(pk=user_id)
    return team_limits(team_ids=user_team_ids(user))


def team_tokens_used(*, team_id: int, since: datetime, until: datetime | None = None) -> int:
    """Tokens (input + output) of the finished runs that count against the team
    ``team_id`` (``UsageEvent.teams``: its members' runs while they were members) from
    ``since`` (inclusive) to ``until`` (exclusive; open-ended when ``None``), demo usage
    left out. One query."""
    events = UsageEvent.objects.filter(teams__id=team_id, created__gte=since, demo=False)
    if until is not None:
        events = events.filter(created__lt=until)
    return events.aggregate(tokens=Coalesce(Sum(TOKENS), 0))["tokens"]


def team_budget_status(
    *, team_id: int, name: str, limit: int, now: datetime | None = None
) -> dict[str, Any]:
    """A team's month: ``{"id", "name", "monthly_limit", "used_this_month",
    "resets_at"}`` (tokens; 0 = unlimited; ``resets_at`` the next month's start, UTC)."""
    now = now or timezone.now()
    resets_at = next_month_start(now)
    return {
        "id": team_id,
        "name": name,
        "monthly_limit": limit,
        "used_this_month": team_tokens_used(
            team_id=team_id, since=month_start(now), until=resets_at
        ),
        "resets_at": resets_at,
    }


def team_budget_get(*, team_id: int) -> int:
    """The team's monthly budget in tokens (0: none, unlimited)."""
    row = TeamBudget.objects.filter(team_id=team_id).values_list("monthly_tokens", flat=True)
    return row.first() or 0


def budget_status(*, user_id: int, now: datetime | None = None) -> dict[str, Any]:
    """Where the user stands against their budgets: ``{"monthly_limit": int,
    "used_this_month": int, "resets_at": datetime, "run_limit": int}``. Limits are
    tokens (per calendar month in UTC, per run; 0 = unlimited), ``used_this_month`` the
    tokens of runs that ended since the month began (demo usage left out), ``resets_at`` the next month's
    start (UTC); ``"teams"``: the budgets of the user's teams that have one, by name, each
    :func:`team_budget_status` (what the team's members used this month while members)."""
    now = now or timezone.now()
    limits = budget_limits(user_id=user_id)
    resets_at = next_month_start(now)
    return {
        "monthly_limit": limits.monthly,
        "used_this_month": tokens_used(user_id=user_id, since=month_start(now), until=resets_at),
        "resets_at": resets_at,
        "run_limit": limits.run,
        "teams": [
            team_budget_status(team_id=team.team_id, name=team.name, limit=team.monthly, now=now)
            for team in user_team_limits(user_id=user_id)
        ],
    }


def usage_subject(*, requester: Any, user: str | None) -> Any:
    """Whose usage ``requester`` asks for with ``?user=`` (a username or an id).

    Without it, or naming themselves, the requester. Only staff may name someone else:
    :class:`Forbidden` otherwise (also for names that do not exist, so nothing leaks);
    staff get :class:`NotFound` for an unknown user.
    """
    if user is None or user == "":
        return requester
    value = user.strip()
    if not requester.is_staff:
        if value in (requester.get_username(), str(requester.pk)):
            return requester
        raise Forbidden("Only staff can see another user's usage.", code="forbidden")
    users = get_user_model().objects
    found = users.filter(username=value).first()
    if found is None and value.isdigit():
        found = users.filter(pk=int(value)).first()
    if found is None:
        raise NotFound("No such user.")
    return found


def usage_totals(events: QuerySet[UsageEvent]) -> dict[str, int]:
    """Sums over ``events``: ``{"input_tokens", "output_tokens", "tokens", "rounds",
    "runs"}`` (tokens and rounds as counted by the providers; runs = ledger rows)."""
    totals = events.order_by().aggregate(
        input_tokens=Coalesce(Sum("input_tokens"), 0),
        output_tokens=Coalesce(Sum("output_tokens"), 0),
        rounds=Coalesce(Sum("rounds"), 0),
        runs=Count("id"),
    )
    totals["tokens"] = totals["input_tokens"] + totals["output_tokens"]
    return totals


def _grouped(events: QuerySet[UsageEvent], *keys: str) -> list[dict[str, Any]]:
    rows = (
        events.order_by()
        .values(*keys)
        .annotate(
            input_tokens=Coalesce(Sum("input_tokens"), 0),
            output_tokens=Coalesce(Sum("output_tokens"), 0),
            rounds=Coalesce(Sum("rounds"), 0),
            runs=Count("id"),
        )
    )
    result = []
    for row in rows:
        row["tokens"] = row["input_tokens"] + row["output_tokens"]
        result.append(row)
    return result


def usage_report(
    *, user: Any, date_from: date | None, date_to: date | None, now: datetime | None = None
) -> dict[str, Any]:
    """The user's usage over whole UTC days ``date_from`` to ``date_to`` (both included;
    ``date_to`` defaults to today, ``date_from`` to the first day of ``date_to``'s month)::

        {"user": {"id": int, "username": str},
         "from": date, "to": date,
         "totals": {"input_tokens", "output_tokens", "tokens", "rounds", "runs"},
         "daily": [{"date": date, "input_tokens", "output_tokens", "tokens", "rounds",
                    "runs"}, ...],                     # every day of the range, zeros too
         "by_conversation": [{"conversation_id": UUID | None, "title": str,
                              ...the same sums}, ...], # most tokens first; None: deleted
         "by_model": [{"provider": str, "model": str, ...the same sums}, ...],
         "budget": budget_status(...)}

    All counts are tokens except ``rounds`` (model calls) and ``runs`` (finished runs).
    Raises :class:`InvalidRequest` (``invalid_range``) when ``from`` is after ``to`` or
    the range is longer than ``MAX_RANGE_DAYS`` days.
    """
    now = now or timezone.now()
    date_to = date_to or now.astimezone(UTC).date()
    date_from = date_from or date_to.replace(day=1)
    if date_from > date_to:
        raise InvalidRequest("`from` is after `to`.", code="invalid_range")
    days = (date_to - date_from).days + 1
    if days > MAX_RANGE_DAYS:
        raise InvalidRequest(
            f"The range is {days} days long; at most {MAX_RANGE_DAYS} are allowed.",
            code="invalid_range",
        )
    events = UsageEvent.objects.filter(
        user_id=user.pk,
        created__gte=day_start(date_from),
        created__lt=day_start(date_to + timedelta(days=1)),
    )
    zero = {"input_tokens": 0, "output_tokens": 0, "tokens": 0, "rounds": 0, "runs": 0}
    per_day = {
        row["day"]: row
        for row in _grouped(events.annotate(day=TruncDate("created", tzinfo=UTC)), "day")
    }
    daily = []
    for offset in range(days):
        day = date_from + timedelta(days=offset)
        row = per_day.get(day, zero)
        daily.append({"date": day, **{key: row[key] for key in zero}})
    by_conversation = [
        {
            "conversation_id": row["conversation_id"],
            "title": row["conversation__title"] or "",
            **{key: row[key] for key in zero},
        }
        for row in _grouped(events, "conversation_id", "conversation__title")
    ]
    by_model = [
        {"provider": row["provider"], "model": row["model"], **{key: row[key] for key in zero}}
        for row in _grouped(events, "provider", "model")
    ]
    by_conversation.sort(key=lambda r: (-r["tokens"], r["title"], str(r["conversation_id"])))
    by_model.sort(key=lambda r: (-r["tokens"], r["provider"], r["model"]))
    return {
        "user": {"id": user.pk, "username": user.get_username()},
        "from": date_from,
        "to": date_to,
        "totals": usage_totals(events),
        "daily": daily,
        "by_conversation": by_conversation,
        "by_model": by_model,
        "budget": budget_status(user_id=user.pk, now=now),
    }
