"""Admin for operators: conversations, runs (with their events), approvals (an audit
trail of who decided what, how and when) and shares (to stop one)."""

from __future__ import annotations

from django.contrib import admin
from django.db import transaction

from conversations.models import Approval, Conversation, ConversationFile, Run, RunEvent, Share
from conversations.services.workspaces import share_folder_remove
from paw_project.adminkit import PawModelAdmin


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def get_readonly_fields(self, request, obj=None) -> tuple[str, ...]:
        # Every field shown, read-only: a form built with a non-editable field
        # (``created_at``) raised FieldError, so the conversation's page answered 500.
        return tuple(self.fields or ())


class FileInline(ReadOnlyInline):
    model = ConversationFile
    fields = ("name", "size", "sha256", "created_at")


class RunInline(ReadOnlyInline):
    model = Run
    fields = ("id", "status", "model", "created_at", "finished_at")


@admin.register(Conversation)
class ConversationAdmin(PawModelAdmin):
    list_display = ("title", "id", "user", "auto_approve", "last_activity_at")
    list_filter = ("auto_approve",)
    search_fields = ("id", "title", "user__username")
    readonly_fields = (
        "id",
        "event_cursor",
        "created_at",
        "updated_at",
        "last_activity_at",
        "memory_since",
    )
    inlines = (FileInline, RunInline)


@admin.register(Run)
class RunAdmin(PawModelAdmin):
    list_display = (
        "id",
        "conversation",
        "user",
        "status",
        "provider",
        "model",
        "node",
        "created_at",
        "finished_at",
    )
    list_filter = ("status", "runtime_gated", "provider", "model", "node")
    search_fields = ("id", "conversation__id", "user__username", "prompt")
    readonly_fields = [f.name for f in Run._meta.fields]

    def has_add_permission(self, request) -> bool:
        return False


class EventTypeFilter(admin.SimpleListFilter):
    """The event types as fixed choices: listing the distinct types of a large events table
    would scan all of it on every page."""

    title = "type"
    parameter_name = "type"
    TYPES = (
        "start", "delta", "notify", "log", "result", "error", "notice", "policy_violation",
    )  # fmt: skip

    def lookups(self, request, model_admin):
        return [(name, name) for name in self.TYPES]

    def queryset(self, request, queryset):
        return queryset.filter(type=self.value()) if self.value() else queryset


@admin.register(RunEvent)
class RunEventAdmin(PawModelAdmin):
    """Events, paginated: a run can have thousands (filter by run id in the search box);
    no full count on filtered pages (it would count the whole table again)."""

    list_display = ("cursor", "conversation", "run", "type", "kind", "created_at")
    list_filter = (EventTypeFilter,)
    show_full_result_count = False
    search_fields = ("=run__id", "=conversation__id")
    readonly_fields = [f.name for f in RunEvent._meta.fields]
    list_select_related = ("conversation", "run")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Approval)
class ApprovalAdmin(PawModelAdmin):
    list_display = (
        "id",
        "conversation",
        "prompt_text",
        "kind",
        "status",
        "decided_by",
        "decided_by_user",
        "via",
        "created_at",
        "decided_at",
        "used_at",
    )
    list_filter = ("kind", "status", "decided_by", "via")
    # decided_by_user is nullable, so the admin's automatic select_related skips it.
    list_select_related = ("decided_by_user", "conversation")
    search_fields = ("id", "run__id", "conversation__id", "prompt")
    readonly_fields = [f.name for f in Approval._meta.fields]

    @admin.display(description="prompt", ordering="prompt")
    def prompt_text(self, approval: Approval) -> str:
        """What the person was asked, cut to one line of the list."""
        text = " ".join((approval.prompt or "").split())
        return text if len(text) <= 120 else text[:119] + "…"

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Share)
class ShareAdmin(PawModelAdmin):
    """The shared conversations, read-only: an operator may stop one (delete it: its link
    answers 404 at once, its snapshot's files are removed)."""

    list_display = (
        "id", "conversation", "owner", "audience", "created_at", "snapshot_at", "expires_at",
    )  # fmt: skip
    list_filter = ("audience",)
    list_select_related = ("conversation__user",)
    search_fields = ("=id", "=conversation__id", "conversation__user__username")
    readonly_fields = ["owner", *(f.name for f in Share._meta.fields), "teams"]
    exclude = ("runs",)

    @admin.display(description="owner", ordering="conversation__user__username")
    def owner(self, share: Share) -> str:
        return share.conversation.user.get_username()

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def delete_model(self, request, obj: Share) -> None:
        share_id = obj.id
        super().delete_model(request, obj)
        transaction.on_commit(lambda: share_folder_remove(share_id))

    def delete_queryset(self, request, queryset) -> None:
        share_ids = list(queryset.values_list("id", flat=True))
        super().delete_queryset(request, queryset)
        for share_id in share_ids:
            transaction.on_commit(lambda share_id=share_id: share_folder_remove(share_id))
