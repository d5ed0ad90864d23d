"""The usage ledger and per-user budgets.

Fields and constraints only; writes live in ``services.py``, reads in ``selectors.py``.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class UsageEvent(models.Model):
    """The tokens one finished run used: one row per run (``done``, ``error`` or
    ``cancelled``), written in the transaction that finishes the run.

    Tokens are the provider's counts (``estimated`` when the provider reported none and
    the runtime estimated them, or when the runtime reported none at all, cancelled,
    crashed or lost mid-stream, and PAW estimated them from the prompt, the history sent
    and the text streamed). The row outlives its conversation and run (both become
    ``NULL`` when deleted), so deleting a conversation never gives a budget back.

    ``teams``: the teams the user was a member of when the row was written; a team's
    monthly budget counts the rows that name it (its members' usage while they were
    members). A many-to-many relation rather than an array, for SQLite (embedded mode).

    ``demo`` rows are the offline demo's runs (provider ``demo``): listed like any other,
    left out of what budgets count (``billing.selectors.tokens_used``).
    """

    id = models.BigAutoField(primary_key=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="usage_events"
    )
    conversation = models.ForeignKey(
        "conversations.Conversation",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="usage_events",
    )
    # Unique: exactly one ledger row per run.
    run = models.OneToOneField(
        "conversations.Run",
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="usage_event",
    )
    run_status = models.CharField(max_length=16, blank=True, default="")
    provider = models.CharField(max_length=64, blank=True, default="")
    model = models.CharField(max_length=200, blank=True, default="")
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    rounds = models.PositiveIntegerField(default=0, help_text="Model calls.")
    estimated = models.BooleanField(
        default=False,
        help_text=(
            "The provider reported no usage (the runtime estimated it), or the runtime "
            "reported none (PAW estimated it from the prompt, history and streamed text)."
        ),
    )
    demo = models.BooleanField(
        default=False,
        help_text=(
            "The offline demo's scripted model answered (provider demo, no AI): shown as "
            "demo usage, never counted against budgets."
        ),
    )
    created = models.DateTimeField(default=timezone.now, editable=False)
    teams = models.ManyToManyField(
        "auth.Group",
        blank=True,
        related_name="+",
        help_text="The teams its user was a member of when the run ended: the team budgets "
        "it counts against.",
    )

    class Meta:
        ordering = ("-created", "-id")
        indexes = [
            models.Index(fields=["user", "created"], name="usage_user_created"),
            models.Index(fields=["created"], name="usage_created"),
        ]

    def __str__(self) -> str:
        return f"{self.input_tokens + self.output_tokens} tokens ({self.model or 'no model'})"

    @property
    def tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


class Budget(models.Model):
    """A user's own token budgets, overriding ``PAW_BUDGET_MONTHLY_TOKENS`` and
    ``PAW_BUDGET_RUN_TOKENS``. Empty: the server default; ``0``: unlimited."""

    user = models.OneToOneField(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="budget"
    )
    monthly_tokens = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text=(
            "Tokens (input + output) per calendar month, UTC. Empty: the server default "
            "(PAW_BUDGET_MONTHLY_TOKENS); 0: unlimited."
        ),
    )
    run_tokens = models.PositiveBigIntegerField(
        null=True,
        blank=True,
        help_text=(
            "Tokens (input + output) per run. Empty: the server default "
            "(PAW_BUDGET_RUN_TOKENS); 0: unlimited."
        ),
    )
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"Budget of {self.user}"


class TeamBudget(models.Model):
    """A team's monthly token budget: the tokens (input + output) of the runs its members
    finished while they were members (``UsageEvent.teams``) per calendar month (UTC).
    ``0``: unlimited. A run of a member is refused at its start and stopped during it
    once this budget, or the member's own, is spent."""

    team = models.OneToOneField("auth.Group", on_delete=models.CASCADE, related_name="token_budget")
    monthly_tokens = models.PositiveBigIntegerField(
        default=0,
        help_text="Tokens (input + output) per calendar month, UTC, over the members' "
        "runs; 0: unlimited.",
    )
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "team token budget"

    def __str__(self) -> str:
        return f"Budget of team {self.team}"
