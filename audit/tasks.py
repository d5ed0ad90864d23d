"""The audit's Celery task (beat)."""

from __future__ import annotations

from celery import shared_task

from audit import services

TASK_AUDIT_PRUNE = "audit.tasks.audit_prune"


@shared_task(name=TASK_AUDIT_PRUNE)
def audit_prune() -> dict[str, int]:
    """Beat, hourly: remove the audit's rows older than ``PAW_AUDIT_RETENTION_DAYS``."""
    return services.audit_prune()
