"""Helpers for the billing tests: ledger rows written directly (what finished runs leave)."""

from __future__ import annotations

from datetime import UTC, datetime

from django.utils import timezone

from billing.models import UsageEvent


def at(text: str) -> datetime:
    """An aware UTC datetime from ``YYYY-MM-DDTHH:MM:SS[.ffffff]``."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def ledger_event(
    *,
    user,
    input_tokens: int = 0,
    output_tokens: int = 0,
    created: datetime | None = None,
    conversation=None,
    provider: str = "default",
    model: str = "scripted-model",
    rounds: int = 1,
    demo: bool = False,
) -> UsageEvent:
    """A ledger row of ``user`` (no run: as if the run had been deleted since)."""
    return UsageEvent.objects.create(
        user=user,
        conversation=conversation,
        run_status="done",
        provider=provider,
        model=model,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        rounds=rounds,
        demo=demo,
        created=created or timezone.now(),
    )
