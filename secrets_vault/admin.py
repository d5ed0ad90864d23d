"""Admin for secrets (values write-only, never shown), datasources (with a "Test
connection" action) and custom providers. Each save goes through a service."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import method_decorator
from django.views.decorators.debug import sensitive_post_parameters

from secrets_vault.models import CustomProvider, Datasource, Secret
from secrets_vault.services import (
    custom_provider_save,
    datasource_save,
    datasource_test,
    secret_save,
)
from secrets_vault.services.secrets import SECRET_VALUE_MAX_LENGTH


class SecretAdminForm(forms.ModelForm):
    """The model's fields except ``value``, plus a write-only ``new_value``: the page
    never holds the stored value, so it can never show it."""

    new_value = forms.CharField(
        label="Value",
        required=False,
        strip=False,
        max_length=SECRET_VALUE_MAX_LENGTH,
        widget=forms.PasswordInput(render_value=False, attrs={"autocomplete": "new-password"}),
        help_text="Write-only: the stored value is never shown. "
        "Leave blank to keep the current value.",
    )

    class Meta:
        model = Secret
        fields = ("name", "scope", "owner", "description")

    def clean_new_value(self) -> str:
        value = self.cleaned_data.get("new_value", "")
        if not value and self.instance.pk is None:
            raise forms.ValidationError("A new secret needs a value.")
        if "\x00" in value:
            raise forms.ValidationError("A secret value cannot contain a NUL character.")
        return value


@admin.register(Secret)
class SecretAdmin(admin.ModelAdmin):
    form = SecretAdminForm
    list_display = ("name", "scope", "owner", "description", "updated_at", "last_used_at")
    list_filter = ("scope",)
    search_fields = ("name", "owner__username", "description")
    readonly_fields = ("created_at", "updated_at", "last_used_at")
    autocomplete_fields = ("owner",)
    fields = (
        "name",
        "scope",
        "owner",
        "new_value",
        "description",
        "created_at",
        "updated_at",
        "last_used_at",
    )

    @method_decorator(sensitive_post_parameters("new_value"))
    def changeform_view(self, request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        # Error reports (DEBUG pages, mailed errors) show the value as stars.
        return super().changeform_view(request, *args, **kwargs)

    def get_queryset(self, request: HttpRequest) -> QuerySet[Secret]:
        # Values are never loaded for a page.
        return super().get_queryset(request).select_related("owner").defer("value")

    def save_model(self, request: HttpRequest, obj: Secret, form: Any, change: bool) -> None:
        secret_save(secret=obj, value=form.cleaned_data.get("new_value") or None)


@admin.register(Datasource)
class DatasourceAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "dialect", "read_only", "enabled", "updated_at")
    list_filter = ("dialect", "enabled", "read_only")
    search_fields = ("slug", "name", "description")
    readonly_fields = ("env_name", "created_at", "updated_at")
    fields = (
        "slug",
        "name",
        "description",
        "dialect",
        "connection",
        "read_only",
        "enabled",
        "env_name",
        "created_at",
        "updated_at",
    )
    actions = ("test_connection",)

    @admin.display(description="Sandbox variable")
    def env_name(self, obj: Datasource) -> str:
        return obj.env_name if obj.slug else "-"

    def save_model(self, request: HttpRequest, obj: Datasource, form: Any, change: bool) -> None:
        datasource_save(datasource=obj)

    @admin.action(description="Test connection")
    def test_connection(self, request: HttpRequest, queryset: QuerySet[Datasource]) -> None:
        """Really connect to each selected datasource (placeholders resolved for the
        operator: their own secret first, then a global one) and report each outcome."""
        for datasource in queryset:
            result = datasource_test(datasource=datasource, user=request.user)
            level = messages.SUCCESS if result.ok else messages.ERROR
            self.message_user(
                request, f"Test connection of {datasource.slug}: {result.message}", level
            )


@admin.register(CustomProvider)
class CustomProviderAdmin(admin.ModelAdmin):
    list_display = ("name", "label", "base_url", "key_secret_name", "default_model", "enabled")
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    list_filter = ("enabled",)
    search_fields = ("name", "label", "base_url")

    def save_model(
        self, request: HttpRequest, obj: CustomProvider, form: Any, change: bool
    ) -> None:
        custom_provider_save(provider=obj)
