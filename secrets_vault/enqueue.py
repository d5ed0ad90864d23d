"""The web side of the secrets vault's worker tasks (:mod:`secrets_vault.tasks`): sent by
name on the default ``runs`` queue every worker node consumes, so the sender loads none of
the worker's code. Call after commit: the worker must find what the task names."""

from __future__ import annotations

from celery import current_app

TASK_SCHEMA_REFRESH = "secrets_vault.tasks.datasource_schema_refresh"
TASK_KNOWLEDGE_EMBED = "secrets_vault.tasks.knowledge_embed"


def schema_refresh_enqueue(*, datasource_id: int, user_id: int | None) -> None:
    """Have a worker harvest the datasource's schema, resolving its placeholders for the
    user ``user_id`` (None: global secrets only)."""
    current_app.send_task(TASK_SCHEMA_REFRESH, args=[datasource_id, user_id])


def knowledge_embed_enqueue(*, datasource_id: int) -> None:
    """Have a worker embed the datasource's entries that have no vector yet."""
    current_app.send_task(TASK_KNOWLEDGE_EMBED, args=[datasource_id])
