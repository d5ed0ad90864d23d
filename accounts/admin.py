from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin

from accounts.models import User
from billing.admin import BudgetInline


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    """Django's user admin, showing the token version (bumped on logout/password change)
    and the user's token budget (``billing``)."""

    inlines = (BudgetInline,)
    readonly_fields = ("token_version", "last_login", "date_joined")
    fieldsets = (*DjangoUserAdmin.fieldsets, ("Tokens", {"fields": ("token_version",)}))
