"""Reads of sandboxes and worker nodes: which node owns a conversation's live sandbox, and
whether a node is alive. Used on both sides of the broker (the web side routes tasks with
them; the node side and the reaper check nodes)."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from sandboxes.models import Sandbox, WorkerNode


def node_is_alive(name: str) -> bool:
    """Whether the worker node ``name`` has a heartbeat younger than
    ``PAW_NODE_DEAD_SECONDS`` and has not stopped."""
    cutoff = timezone.now() - timedelta(seconds=settings.PAW_NODE_DEAD_SECONDS)
    return WorkerNode.objects.filter(
        name=name, heartbeat_at__gte=cutoff, stopped_at__isnull=True
    ).exists()


def owner_node(conversation_id: uuid.UUID) -> str | None:
    """The live node whose sandbox holds the conversation, or ``None`` (no live sandbox,
    or its node is lost)."""
    node = (
        Sandbox.objects.filter(conversation_id=conversation_id, state__in=Sandbox.LIVE_STATES)
        .values_list("node", flat=True)
        .first()
    )
    return node if node and node_is_alive(node) else None


def live_sandbox_nodes(conversation_id: uuid.UUID) -> set[str]:
    """The nodes holding a live sandbox row of the conversation (normally at most one)."""
    return set(
        Sandbox.objects.filter(
            conversation_id=conversation_id, state__in=Sandbox.LIVE_STATES
        ).values_list("node", flat=True)
    )


def lost_node_names(*, silent_for_seconds: float) -> list[str]:
    """Nodes not stopped whose last heartbeat is older than ``silent_for_seconds``."""
    cutoff = timezone.now() - timedelta(seconds=silent_for_seconds)
    return list(
        WorkerNode.objects.filter(heartbeat_at__lt=cutoff, stopped_at__isnull=True).values_list(
            "name", flat=True
        )
    )


def stopped_node_names() -> list[str]:
    """Nodes that said they stopped."""
    return list(WorkerNode.objects.filter(stopped_at__isnull=False).values_list("name", flat=True))
