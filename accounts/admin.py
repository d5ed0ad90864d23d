from django.contrib import admin
from django.contrib.auth.admin import UserAdmin as DjangoUserAdmin

from accounts.models import User


@admin.register(User)
class UserAdmin(DjangoUserAdmin):
    """Django's user admin, showing the token version (bumped on logout/password change)."""

    readonly_fields = ("token_version", "last_login", "date_joined")
    fieldsets = (*DjangoUserAdmin.fieldsets, ("Tokens", {"fields": ("token_version",)}))
