"""Celery edges of the secrets vault, run by any worker node: each parses its ids and calls
the service it is named after. Sent by :mod:`secrets_vault.enqueue`. Both are idempotent:
a redelivered refresh harvests again, a redelivered embedding finds nothing to do."""

from __future__ import annotations

from celery import shared_task
from django.contrib.auth import get_user_model

from secrets_vault import enqueue
from secrets_vault.services import knowledge


@shared_task(name=enqueue.TASK_SCHEMA_REFRESH, acks_late=True)
def datasource_schema_refresh(datasource_id: int, user_id: int | None) -> int | None:
    """Harvest a datasource's live schema into its schema entries (credentials resolved
    here, on the worker, for the operator who asked)."""
    user = get_user_model().objects.filter(pk=user_id).first() if user_id is not None else None
    return knowledge.datasource_schema_refresh(datasource_id=datasource_id, user=user)


@shared_task(name=enqueue.TASK_KNOWLEDGE_EMBED, acks_late=True)
def knowledge_embed(datasource_id: int) -> int:
    """Embed the datasource's entries that have no vector by the configured model."""
    return knowledge.knowledge_embed(datasource_id=datasource_id)
