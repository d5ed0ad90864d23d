"""Admin for operators: the usage ledger (read-only, with totals of the filtered rows) and
each user's budgets (an inline on the user page, ``accounts.admin.UserAdmin``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse

from billing.models import Budget, UsageEvent
from billing.selectors import TOKENS, usage_totals
from paw_project.adminkit import PawModelAdmin


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
    readonly_fields = [f.name for f in UsageEvent._meta.fields]

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
