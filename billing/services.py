"""Billing rules: the ledger entry of each finished run, and the budgets that stop
spending before it happens (at a run's start) and while it happens (during a run).

Tokens are input + output tokens as the provider counted them. Budgets are
``billing.selectors.budget_limits`` (per user, falling back to ``PAW_BUDGET_*``; 0 is
unlimited); a month is a calendar month in UTC.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from billing.models import TeamBudget, UsageEvent
from billing.selectors import (
    TeamLimit,
    budget_limits,
    iso_utc,
    month_start,
    next_month_start,
    team_tokens_used,
    tokens_used,
    usage_is_demo,
    user_team_limits,
)
from paw_project import metrics
from paw_project.errors import BudgetExhausted, InvalidRequest
from teams.selectors import user_team_ids

logger = logging.getLogger(__name__)

#: Seconds a running run's view of "tokens used this month by the user's other runs" is
#: reused before the ledger is summed again (runs of the same user that end meanwhile).
MONTHLY_REFRESH_SECONDS = 10.0


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def usage_normalize(raw: Any) -> dict[str, Any]:
    """A run's usage as PAW stores it, from what a runtime reported (untrusted: anything
    but non-negative integers counts 0): ``{"input": int, "output": int, "rounds": int,
    "estimated": bool}`` (tokens, tokens, model calls)."""
    raw = raw if isinstance(raw, dict) else {}
    usage: dict[str, Any] = {key: _count(raw.get(key)) for key in ("input", "output", "rounds")}
    usage["estimated"] = bool(raw.get("estimated", False))
    return usage


def usage_merge(final: Any, running: Any) -> dict[str, Any]:
    """The usage to bill when a run reports final totals (its ``result``) and PAW also
    saw running totals (its last ``notify usage``): the larger count of each, so a result
    that under-reports (a cancelled run may report only some rounds, or 0) is billed for
    what the run was seen to use. ``estimated`` if either says so."""
    final, running = usage_normalize(final), usage_normalize(running)
    merged: dict[str, Any] = {
        key: max(final[key], running[key]) for key in ("input", "output", "rounds")
    }
    merged["estimated"] = final["estimated"] or running["estimated"]
    return merged


def estimate_tokens(chars: int) -> int:
    """Tokens of ``chars`` characters of text, estimated as paw-agent estimates them (~3.5
    characters per token; at least 1 for any text, 0 for none)."""
    return (chars * 2 + 6) // 7 if chars > 0 else 0


def usage_estimate(*, sent_chars: int, streamed_chars: int, rounds: int = 0) -> dict[str, Any]:
    """The usage of a run that used the model but reported no tokens (it was cancelled,
    timed out, crashed or lost mid-stream), from what PAW saw: ``sent_chars`` characters
    sent to the model (its prompt and the history it carries) as input, ``streamed_chars``
    characters of text it streamed as output; ``rounds`` model calls (at least 1). Flagged
    ``estimated``. A lower bound: tool results and system prompts are not counted."""
    return {
        "input": estimate_tokens(sent_chars),
        "output": estimate_tokens(streamed_chars),
        "rounds": max(_count(rounds), 1),
        "estimated": True,
    }


def usage_record(*, run: Any) -> UsageEvent:
    """Write the ledger row of a finished run (``run.usage`` = ``{"input", "output",
    "rounds", "estimated"}``, tokens; missing keys count 0), attributed to its user,
    conversation, provider and model, and to the teams its user is a member of now (the
    team budgets it counts against); a run of the offline demo's provider is marked
    ``demo`` (:func:`~billing.selectors.usage_is_demo`).

    Called by ``conversations.services.runs`` in the transaction that finishes the run,
    under the run's row lock. Idempotent: a run already in the ledger keeps its row (the
    unique ``run`` column makes "exactly one per run" hold even against a bug upstream).
    """
    usage = usage_normalize(run.usage)
    event, created = UsageEvent.objects.get_or_create(
        run_id=run.id,
        defaults={
            "user_id": run.user_id,
            "conversation_id": run.conversation_id,
            "run_status": run.status,
            "provider": run.provider,
            "model": run.model,
            "input_tokens": usage["input"],
            "output_tokens": usage["output"],
            "rounds": usage["rounds"],
            "estimated": usage["estimated"],
            "demo": usage_is_demo(provider=run.provider),
            "created": run.finished_at or timezone.now(),
        },
    )
    if created:
        event.teams.set(user_team_ids(run.user))
        transaction.on_commit(
            lambda: metrics.tokens_used(
                provider=event.provider,
                model=event.model,
                input=event.input_tokens,
                output=event.output_tokens,
                estimated=event.estimated,
            )
        )
    else:
        logger.warning("run %s is already in the usage ledger; not billed again", run.id)
    return event


def budget_check_start(*, user_id: int, provider: str = "", now: datetime | None = None) -> None:
    """Refuse to start a run on ``provider`` once the user's monthly budget, or the
    monthly budget of one of their teams (:class:`~billing.models.TeamBudget`), is used
    up. A run of the offline demo (:func:`~billing.selectors.usage_is_demo`) always
    starts: it costs nothing, so no budget applies to it.

    Raises :class:`BudgetExhausted` (402, ``budget_exhausted``) with ``extra``
    ``{"used": int, "limit": int, "resets_at": "YYYY-MM-01T00:00:00Z"}`` (tokens; the
    next month's start, UTC) when the tokens used this month are at or over the limit;
    for a team's budget the detail names the team ("... team analysts ...") and
    ``extra`` adds ``"team": {"id", "name"}``. A user one token under it can start (the
    run itself is then stopped once it passes the limit: :class:`RunBudgetGuard`). Two
    queries when nothing is limited (the user's budget, their teams' budgets).
    """
    if usage_is_demo(provider=provider):
        return
    now = now or timezone.now()
    resets_at = next_month_start(now)
    limit = budget_limits(user_id=user_id).monthly
    if limit:
        used = tokens_used(user_id=user_id, since=month_start(now), until=resets_at)
        if used >= limit:
            metrics.budget_refused(stage="start")
            raise BudgetExhausted(
                f"Your monthly token budget is used up ({used} of {limit} tokens); "
                f"it resets on {resets_at:%Y-%m-%d} (UTC).",
                code="budget_exhausted",
                extra={"used": used, "limit": limit, "resets_at": iso_utc(resets_at)},
            )
    for team in user_team_limits(user_id=user_id):
        used = team_tokens_used(team_id=team.team_id, since=month_start(now), until=resets_at)
        if used >= team.monthly:
            metrics.budget_refused(stage="start")
            raise BudgetExhausted(
                f"The monthly token budget of team {team.name} is used up ({used} of "
                f"{team.monthly} tokens); it resets on {resets_at:%Y-%m-%d} (UTC).",
                code="budget_exhausted",
                extra={
                    "used": used,
                    "limit": team.monthly,
                    "resets_at": iso_utc(resets_at),
                    "team": {"id": team.team_id, "name": team.name},
                },
            )


@dataclass
class _RunBudget:
    user_id: int
    run_limit: int
    monthly_limit: int
    month: datetime
    used_before: int  # tokens of the user's finished runs this month (this run excluded)
    loaded_at: float
    tokens: int = 0  # the run's latest running total
    seen_at: float = 0.0  # when its latest usage line was checked (monotonic)
    demo: bool = False  # the offline demo's run: no limit, and it counts for nobody
    # The budgets of the user's teams (at the run's first usage line), and per team the
    # tokens of its members' finished runs this month (this run excluded).
    teams: list[TeamLimit] = field(default_factory=list)
    team_used_before: dict[int, int] = field(default_factory=dict)


def _run_is_demo(run_id: uuid.UUID) -> bool:
    """Whether the run ``run_id`` is on the offline demo's provider (one query; the run
    model is the ledger's ``run`` relation, so billing names no other app's module)."""
    runs = UsageEvent._meta.get_field("run").related_model.objects
    provider = runs.filter(pk=run_id).values_list("provider", flat=True).first()
    return usage_is_demo(provider=provider or "")


class RunBudgetGuard:
    """Checks a running run's usage (the runtime's ``notify usage`` running totals)
    against its budgets. One per node, used by the event pipeline's writer thread only
    (not thread-safe).

    Cheap on the hot path: a run's limits are loaded once, at its first usage line
    (four small queries, and one per team with a budget); after that a check is
    arithmetic, plus one ledger sum per monthly limit (the user's, each team's) every
    ``MONTHLY_REFRESH_SECONDS``.

    The monthly check counts the user's finished runs (the ledger), the run itself, and
    the running totals of the user's other runs going on on this node. Each budget of the
    user's teams (their teams at the run's first usage line) likewise counts the ledger
    rows of the team, the run, and the runs going on here of everyone counting against
    that team. Runs on other nodes count once they end (within ``MONTHLY_REFRESH_SECONDS``). A run of the offline
    demo (its provider, read once with its limits) is never stopped and counts for no
    other run: demo usage is not charged to budgets.
    """

    def __init__(self) -> None:
        self._runs: dict[uuid.UUID, _RunBudget] = {}

    def check(self, *, run_id: uuid.UUID, user_id: int, usage: dict[str, Any]) -> str | None:
        """``None`` while the run is within its budgets, else the reason to stop it (a
        sentence for the person; a team's budget is named: "... team analysts ...").
        ``user_id``: the run's user; ``usage``: ``{"input", "output", ...}`` running totals
        (tokens). A run is stopped once it is *past* a limit: its tokens over the run
        limit, or this month's tokens (its own included) over the monthly limit, the
        user's or one of their teams'."""
        budget = self._budget(run_id, user_id)
        tokens = _count(usage.get("input")) + _count(usage.get("output"))
        budget.tokens = tokens
        budget.seen_at = time.monotonic()
        if budget.run_limit and tokens > budget.run_limit:
            return (
                f"The run used {tokens} tokens, more than its budget of {budget.run_limit} "
                "tokens per run, so PAW stopped it."
            )
        if budget.monthly_limit or budget.teams:
            self._refresh(budget)
        if budget.monthly_limit:
            others = sum(
                other.tokens
                for other_id, other in self._runs.items()
                if other.user_id == budget.user_id and other_id != run_id and not other.demo
            )
            used = budget.used_before + others + tokens
            if used > budget.monthly_limit:
                return (
                    f"Your monthly token budget of {budget.monthly_limit} tokens is used up "
                    f"({used} tokens this month), so PAW stopped the run; it resets on "
                    f"{next_month_start(budget.month):%Y-%m-%d} (UTC)."
                )
        for team in budget.teams:
            others = sum(
                other.tokens
                for other_id, other in self._runs.items()
                if other_id != run_id and not other.demo and team.team_id in other.team_used_before
            )
            used = budget.team_used_before.get(team.team_id, 0) + others + tokens
            if used > team.monthly:
                return (
                    f"The monthly token budget of team {team.name} ({team.monthly} tokens) is "
                    f"used up ({used} tokens this month by its members), so PAW stopped the "
                    f"run; it resets on {next_month_start(budget.month):%Y-%m-%d} (UTC)."
                )
        return None

    def forget(self, run_id: uuid.UUID) -> None:
        """Drop what is cached for a run that ended. Its tokens move into the finished
        usage of the user's other runs here (as the ledger will say at their next
        refresh)."""
        ended = self._runs.pop(run_id, None)
        if ended is None or ended.demo:
            return
        for other in self._runs.values():
            if other.user_id == ended.user_id:
                other.used_before += ended.tokens
            for team_id in ended.team_used_before.keys() & other.team_used_before.keys():
                other.team_used_before[team_id] += ended.tokens

    def _budget(self, run_id: uuid.UUID, user_id: int) -> _RunBudget:
        budget = self._runs.get(run_id)
        if budget is not None:
            return budget
        self._evict_stale()
        month = month_start(timezone.now())
        if _run_is_demo(run_id):
            budget = _RunBudget(
                user_id=user_id, run_limit=0, monthly_limit=0, month=month, used_before=0,
                loaded_at=time.monotonic(), demo=True,
            )  # fmt: skip
            self._runs[run_id] = budget
            return budget
        limits = budget_limits(user_id=user_id)
        teams = user_team_limits(user_id=user_id)
        budget = _RunBudget(
            user_id=user_id,
            run_limit=limits.run,
            monthly_limit=limits.monthly,
            month=month,
            used_before=tokens_used(user_id=user_id, since=month) if limits.monthly else 0,
            loaded_at=time.monotonic(),
            teams=teams,
            team_used_before={
                team.team_id: team_tokens_used(team_id=team.team_id, since=month) for team in teams
            },
        )
        self._runs[run_id] = budget
        return budget

    def _evict_stale(self) -> None:
        """Forget runs silent for longer than any run may last: they ended in a way the
        pipeline did not see (a dropped batch), and must not count as going on."""
        cutoff = time.monotonic() - settings.PAW_RUN_TIMEOUT_SECONDS - 60
        for run_id in [r for r, b in self._runs.items() if b.seen_at < cutoff]:
            del self._runs[run_id]

    @staticmethod
    def _refresh(budget: _RunBudget) -> None:
        if time.monotonic() - budget.loaded_at < MONTHLY_REFRESH_SECONDS:
            return
        budget.month = month_start(timezone.now())
        if budget.monthly_limit:
            budget.used_before = tokens_used(user_id=budget.user_id, since=budget.month)
        for team in budget.teams:
            budget.team_used_before[team.team_id] = team_tokens_used(
                team_id=team.team_id, since=budget.month
            )
        budget.loaded_at = time.monotonic()


def team_budget_set(*, team_id: int, monthly_tokens: int) -> TeamBudget:
    """Set the monthly token budget of the team ``team_id`` (tokens, input + output, per
    calendar month in UTC, over its members' runs; ``0``: unlimited). Raises
    :class:`InvalidRequest` ``invalid`` for a negative or non-integer value."""
    if (
        isinstance(monthly_tokens, bool)
        or not isinstance(monthly_tokens, int)
        or monthly_tokens < 0
    ):
        raise InvalidRequest(
            "monthly_tokens is a whole number of tokens, 0 or more.", code="invalid"
        )
    budget, _ = TeamBudget.objects.update_or_create(
        team_id=team_id, defaults={"monthly_tokens": monthly_tokens}
    )
    return budget
