"""Admin for operators: the usage ledger (read-only, with totals of the filtered rows),
each user's budgets (an inline on the user page, ``accounts.admin.UserAdmin``) and each
team's (an inline on the team's page, through ``teams.admin.TEAM_INLINES``, and the list
of team budgets with each team's month)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.utils import timezone

from billing.models import Budget, TeamBudget, UsageEvent
from billing.selectors import TOKENS, month_start, team_tokens_used, usage_totals
from paw_project.adminkit import PawModelAdmin
from teams.admin import TEAM_INLINES


def _team_month(budget: TeamBudget | None) -> str:
    """A team's month as the admin shows it: "1234 of 5000 tokens" (or "of unlimited")."""
    if budget is None or budget.team_id is None:
        return "-"
    used = team_tokens_used(team_id=budget.team_id, since=month_start(timezone.now()))
    return f"{used} of {budget.monthly_tokens or 'unlimited'} tokens"


class BudgetInline(admin.StackedInline):
    """A user's own budgets; leave a field empty for the server default, 0 is
    unlimited."""

    model = Budget
    can_delete = True
    max_num = 1
    extra = 1
    fields = ("monthly_tokens", "run_tokens")
    verbose_name = "token budget"
    verbose_name_plural = "token budget (empty: the server default; 0: unlimited)"


class TeamBudgetInline(admin.StackedInline):
    """A team's monthly token budget (0: unlimited) and its month so far, on the team's
    page."""

    model = TeamBudget
    fk_name = "team"
    can_delete = True
    max_num = 1
    extra = 0  # "Add another" makes one: a team has no budget until an operator gives it one
    fields = ("monthly_tokens", "used_this_month")
    readonly_fields = ("used_this_month",)
    verbose_name = "token budget"
    verbose_name_plural = (
        "token budget (tokens per calendar month, UTC, over its members' runs; 0: unlimited)"
    )

    @admin.display(description="used this month (UTC)")
    def used_this_month(self, budget: TeamBudget) -> str:
        return _team_month(budget if budget.pk else None)


TEAM_INLINES.append(TeamBudgetInline)


@admin.register(TeamBudget)
class TeamBudgetAdmin(PawModelAdmin):
    """Every team's budget with its month so far (the ledger rows naming the team)."""

    list_display = ("team", "monthly_tokens", "used_this_month", "updated")
    list_select_related = ("team",)
    ordering = ("team__name",)
    fields = ("team", "monthly_tokens", "used_this_month")
    readonly_fields = ("used_this_month",)

    @admin.display(description="used this month (UTC)")
    def used_this_month(self, budget: TeamBudget) -> str:
        return _team_month(budget if budget.pk else None)


@admin.register(UsageEvent)
class UsageEventAdmin(PawModelAdmin):
    """The ledger: one row per finished run. Nobody edits or deletes it here (budgets
    are computed from it). The change list shows the totals of the filtered rows."""

    list_display = (
        "created",
        "user",
        "conversation",
        "run_status",
        "provider",
        "model",
        "input_tokens",
        "output_tokens",
        "tokens",
        "rounds",
        "estimated",
        "demo",
    )
    list_filter = (
        ("user", admin.RelatedOnlyFieldListFilter),
        ("teams", admin.RelatedOnlyFieldListFilter),
        "model",
        "provider",
        ("created", admin.DateFieldListFilter),
        "run_status",
        "estimated",
        "demo",
    )
    date_hierarchy = "created"
    search_fields = ("=run__id", "=conversation__id", "user__username", "model")
    list_select_related = ("user", "conversation")
    readonly_fields = [f.name for f in UsageEvent._meta.fields] + ["teams"]

    @admin.display(description="tokens", ordering=TOKENS)
    def tokens(self, event: UsageEvent) -> int:
        return event.tokens

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def changelist_view(self, request: HttpRequest, extra_context: Any = None) -> HttpResponse:
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        changelist = context.get("cl") if context else None
        if changelist is not None:
            # The filtered (and searched) rows, every page: billing.selectors.usage_totals.
            context["usage_totals"] = usage_totals(changelist.queryset)
        return response
