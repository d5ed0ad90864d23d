"""Admin for operators: sandboxes (with a stop action) and worker nodes."""

from __future__ import annotations

from django.contrib import admin, messages

from sandboxes.enqueue import sandbox_stop_enqueue
from sandboxes.models import Sandbox, WorkerNode


@admin.register(Sandbox)
class SandboxAdmin(admin.ModelAdmin):
    list_display = (
        "id",
        "conversation",
        "state",
        "node",
        "pid",
        "model",
        "started_at",
        "last_active_at",
        "exit_code",
    )
    list_filter = ("state", "node")
    search_fields = ("id", "conversation__id", "conversation__title", "node")
    readonly_fields = [f.name for f in Sandbox._meta.fields]
    actions = ("stop_sandboxes",)

    def has_add_permission(self, request) -> bool:
        return False

    @admin.action(description="Stop the selected sandboxes")
    def stop_sandboxes(self, request, queryset) -> None:
        live = queryset.filter(state__in=Sandbox.LIVE_STATES)
        conversations = set(live.values_list("conversation_id", flat=True))
        for conversation_id in conversations:
            sandbox_stop_enqueue(conversation_id=conversation_id)
        self.message_user(
            request,
            f"Asked {len(conversations)} sandbox(es) to stop; their state updates in a moment.",
            messages.SUCCESS,
        )


@admin.register(WorkerNode)
class WorkerNodeAdmin(admin.ModelAdmin):
    list_display = ("name", "sandbox_network", "started_at", "heartbeat_at", "stopped_at")
    readonly_fields = ("name", "sandbox_network", "started_at", "heartbeat_at", "stopped_at")

    def has_add_permission(self, request) -> bool:
        return False
