"""Sandboxes (one resident agent runtime process per conversation) and worker nodes."""

from __future__ import annotations

import uuid

from django.db import models
from django.db.models import Q
from django.utils import timezone


class WorkerNode(models.Model):
    """A Celery worker node that owns sandboxes; its heartbeat tells it is alive."""

    name = models.CharField(max_length=200, unique=True)
    started_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now, db_index=True)
    stopped_at = models.DateTimeField(null=True, blank=True)
    #: The network its sandboxes get (``isolated`` or ``host``, PAW_SANDBOX_NETWORK), as
    #: the node's own settings made it when it started.
    sandbox_network = models.CharField(max_length=20, blank=True, default="")

    def __str__(self) -> str:
        return self.name


class Sandbox(models.Model):
    """One runtime process of a conversation, as seen by the node that owns it.

    A conversation has at most one live sandbox (starting, ready, busy or stopping); the
    rows of stopped and dead ones stay as history (exit code, stderr tail).
    """

    class State(models.TextChoices):
        STARTING = "starting"
        READY = "ready"
        BUSY = "busy"
        STOPPING = "stopping"
        STOPPED = "stopped"
        DEAD = "dead"

    LIVE_STATES = (State.STARTING, State.READY, State.BUSY, State.STOPPING)

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    conversation = models.ForeignKey(
        "conversations.Conversation", on_delete=models.CASCADE, related_name="sandboxes"
    )
    node = models.CharField(max_length=200, db_index=True)
    pid = models.IntegerField(null=True, blank=True)
    command = models.CharField(max_length=1000)
    state = models.CharField(max_length=16, choices=State.choices, default=State.STARTING)
    provider = models.CharField(max_length=64, blank=True, default="")
    model = models.CharField(max_length=200, blank=True, default="")
    capabilities = models.JSONField(default=list, blank=True)
    started_at = models.DateTimeField(default=timezone.now)
    last_active_at = models.DateTimeField(default=timezone.now)
    heartbeat_at = models.DateTimeField(default=timezone.now)
    stopped_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    stderr_tail = models.TextField(blank=True, default="")

    class Meta:
        ordering = ("-started_at",)
        constraints = [
            models.UniqueConstraint(
                fields=["conversation"],
                condition=Q(state__in=["starting", "ready", "busy", "stopping"]),
                name="one_live_sandbox_per_conversation",
            )
        ]
        verbose_name_plural = "sandboxes"

    def __str__(self) -> str:
        return f"Sandbox {self.id} ({self.state}, pid {self.pid})"
