from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin

from accounts.models import PersonalToken, User
from billing.admin import BudgetInline


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    """Django's user admin, showing the token version (bumped on logout/password change)
    and the user's token budget (``billing``)."""

    inlines = (BudgetInline,)
    readonly_fields = ("token_version", "last_login", "date_joined")
    fieldsets = (*DjangoUserAdmin.fieldsets, ("Tokens", {"fields": ("token_version",)}))


@admin.register(PersonalToken)
class PersonalTokenAdmin(admin.ModelAdmin):
    """Personal API tokens: who holds which, and when each was last used. Values are never
    stored; an operator can revoke one by deleting it."""

    list_display = ("name", "user", "prefix", "created_at", "last_used_at", "expires_at")
    list_filter = ("created_at",)
    search_fields = ("name", "user__username", "prefix")
    readonly_fields = (
        "user", "name", "prefix", "token_hash", "token_version", "created_at", "last_used_at",
        "expires_at",
    )  # fmt: skip

    def has_add_permission(self, request) -> bool:
        return False  # a value must be shown to its owner once: made by the owner only
