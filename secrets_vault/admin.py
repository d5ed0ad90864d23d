"""Admin for secrets (values write-only, never shown), datasources (with "Test
connection" and "Refresh schema" actions, and their knowledge inline: the harvested schema
read-only, docs and examples editable, an example's SQL checked when saved; on the
knowledge entries' list, actions that mark examples verified or clear it, and a filter),
custom providers and who may use each provider and model (*Provider access*, and on a
team's page the providers limited to it and its model limits). Each save goes through a
service."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.widgets import FilteredSelectMultiple
from django.db import models
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.utils.decorators import method_decorator
from django.utils.html import format_html, format_html_join
from django.views.decorators.debug import sensitive_post_parameters

from paw_project.adminkit import ADD_FORM_HIDDEN_FIELDS, PawModelAdmin
from paw_project.errors import DomainError
from secrets_vault.models import (
    CustomProvider,
    Datasource,
    DatasourceCredential,
    KnowledgeEntry,
    ProviderAccess,
    ProviderModelLimit,
    Secret,
)
from secrets_vault.schema_changes import schema_diff_lines
from secrets_vault.selectors import (
    datasource_stale_examples,
    datasources_with_stale_examples,
    provider_access_list,
    provider_names,
)
from secrets_vault.services import (
    custom_provider_save,
    datasource_credential_delete,
    datasource_credential_save,
    datasource_paw_database_check,
    datasource_privileges_enforce,
    datasource_save,
    datasource_schema_refresh_request,
    datasource_test,
    knowledge_entry_create,
    knowledge_entry_delete,
    knowledge_entry_unverify,
    knowledge_entry_update,
    knowledge_entry_validate,
    knowledge_entry_verify,
    secret_save,
)
from secrets_vault.services.secrets import SECRET_VALUE_MAX_LENGTH
from teams.admin import TEAM_INLINES


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
class SecretAdmin(PawModelAdmin):
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


class KnowledgeEntryForm(forms.ModelForm):
    """A doc or an example; ``clean`` applies the service's rules (an example's SQL is
    run read-only against the datasource, for the operator saving it)."""

    user: Any = None  # set per request by KnowledgeEntryInline.get_formset

    class Meta:
        model = KnowledgeEntry
        fields = ("kind", "title", "text", "sql")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["kind"].choices = [
            (value, label)
            for value, label in KnowledgeEntry.Kind.choices
            if value != KnowledgeEntry.Kind.SCHEMA
        ]

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if self.errors or not self.has_changed() or data.get("DELETE"):
            return data
        kind = data.get("kind") or ""
        sql = "" if kind == KnowledgeEntry.Kind.DOC else data.get("sql") or ""
        try:
            knowledge_entry_validate(
                datasource=self.instance.datasource,
                kind=kind,
                title=data.get("title") or "",
                text=data.get("text") or "",
                sql=sql,
                user=self.user,
                # A kept SQL was checked when it was saved; a changed one runs again, and
                # so does a stale one (passing clears it).
                run_sql=self.instance.pk is None
                or sql != self.instance.sql
                or self.instance.stale_since is not None,
            )
        except DomainError as error:
            raise forms.ValidationError(error.detail) from None
        return data


def verification_text(entry: KnowledgeEntry) -> str:
    """ "by <user> on <date> (knowledge version N)" for a verified example, else ""."""
    if entry.verified_at is None:
        return ""
    who = entry.verified_by.get_username() if entry.verified_by is not None else "a deleted user"
    return (
        f"by {who} on {entry.verified_at:%Y-%m-%d %H:%M} UTC "
        f"(knowledge version {entry.verified_version})"
    )


class VerifiedFilter(admin.SimpleListFilter):
    """Examples verified or not (docs and schema entries are neither)."""

    title = "verified"
    parameter_name = "verified"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Verified examples"), ("no", "Examples not verified")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any]:
        examples = queryset.filter(kind=KnowledgeEntry.Kind.EXAMPLE)
        if self.value() == "yes":
            return examples.filter(verified_at__isnull=False)
        if self.value() == "no":
            return examples.filter(verified_at__isnull=True)
        return queryset


class KnowledgeEntryInline(admin.StackedInline):
    """The datasource's docs and examples."""

    model = KnowledgeEntry
    form = KnowledgeEntryForm
    extra = 0
    verbose_name = "doc or example"
    verbose_name_plural = "Knowledge: docs and examples"
    fields = ("kind", "title", "text", "sql", "flag", "stale", "verification", "updated_at")
    readonly_fields = ("flag", "stale", "verification", "updated_at")

    @admin.display(description="Verified")
    def verification(self, obj: KnowledgeEntry) -> str:
        return verification_text(obj)

    @admin.display(description="Kept from runs")
    def flag(self, obj: KnowledgeEntry) -> str:
        """Why runs are not given this entry (an example that is not a read under the
        current rule), in red; empty when they are."""
        if not obj.flag_reason:
            return ""
        return format_html('<strong class="errornote paw-flag">{}</strong>', obj.flag_reason)

    @admin.display(description="Stale")
    def stale(self, obj: KnowledgeEntry) -> str:
        return _stale_text(obj)

    def get_queryset(self, request: HttpRequest) -> QuerySet[KnowledgeEntry]:
        return (
            super().get_queryset(request).exclude(kind=KnowledgeEntry.Kind.SCHEMA).defer("vector")
        )

    def get_formset(self, request: HttpRequest, obj: Any = None, **kwargs: Any) -> Any:
        formset = super().get_formset(request, obj, **kwargs)
        formset.form = type("KnowledgeEntryRequestForm", (formset.form,), {"user": request.user})
        return formset


def _stale_text(entry: KnowledgeEntry) -> str:
    """A stale example's error and since when, in red (it is kept from runs); empty when
    it is not stale."""
    if entry.stale_since is None:
        return ""
    return format_html(
        '<strong class="errornote paw-stale">Stale since {}: {}</strong> Runs are not given '
        "it until its SQL passes again (the next schema refresh, or saving it).",
        entry.stale_since.strftime("%Y-%m-%d %H:%M UTC"),
        entry.stale_error,
    )


class StaleFilter(admin.SimpleListFilter):
    """Examples that failed when the last schema refresh ran them again, or not."""

    title = "stale"
    parameter_name = "stale"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("yes", "Stale"), ("no", "Not stale")]

    def queryset(
        self, request: HttpRequest, queryset: QuerySet[KnowledgeEntry]
    ) -> QuerySet[KnowledgeEntry]:
        if self.value() == "yes":
            return queryset.filter(stale_since__isnull=False)
        if self.value() == "no":
            return queryset.filter(stale_since__isnull=True)
        return queryset


class SchemaEntryInline(admin.TabularInline):
    """The harvested schema, one row per table (read-only: "Refresh schema" replaces it)."""

    model = KnowledgeEntry
    extra = 0
    max_num = 0
    can_delete = False
    verbose_name = "table"
    verbose_name_plural = "Knowledge: schema (harvested; use the Refresh schema action)"
    fields = ("title", "text", "updated_at")
    readonly_fields = fields

    def get_queryset(self, request: HttpRequest) -> QuerySet[KnowledgeEntry]:
        return super().get_queryset(request).filter(kind=KnowledgeEntry.Kind.SCHEMA).defer("vector")


class DatasourceCredentialForm(forms.ModelForm):
    """A team's own database user and password on the datasource, refused as the service
    refuses it (a literal password, SQLite, a user that can do more than read on a
    read-only datasource: ``services.datasource_credential_save``)."""

    class Meta:
        model = DatasourceCredential
        fields = ("team", "db_user", "password", "priority")

    def _post_clean(self) -> None:
        super()._post_clean()
        if self.errors or not self.has_changed():
            return
        try:
            datasource_privileges_enforce(
                datasource=self.instance.datasource, credential=self.instance
            )
        except DomainError as error:
            self.add_error("db_user", error.detail)


class DatasourceCredentialInline(admin.TabularInline):
    """The teams' own credentials: their members' runs connect as these database users
    (the highest priority of a person's teams); the schema harvest and example checks use
    the datasource's own."""

    model = DatasourceCredential
    form = DatasourceCredentialForm
    extra = 0
    verbose_name = "team credential"
    verbose_name_plural = "Team credentials (runs of a team's members connect as its user)"
    fields = ("team", "db_user", "password", "priority", "privileges", "updated_at")
    readonly_fields = ("privileges", "updated_at")

    @admin.display(description="Its database user, beyond reading")
    def privileges(self, obj: DatasourceCredential) -> str:
        return _privileges_text(obj, datasource=obj.datasource if obj.datasource_id else None)


def _privileges_text(obj: Any, *, datasource: Datasource | None) -> str:
    """What the last check found ``obj``'s database user (a datasource's or a team
    credential's) can do beyond reading; what PAW refuses (or was told to accept) in red."""
    if datasource is None:
        return "-"
    if obj.privileges_checked_at is None:
        if datasource.read_only and datasource.dialect != Datasource.Dialect.SQLITE:
            return "Not checked yet: it is checked when saved or tested."
        return "-"
    found = obj.user_privileges or {}
    refused, noted = found.get("refused") or [], found.get("noted") or []
    if not refused:
        return "Nothing: it can only read." + (f" (Also: {'; '.join(noted)}.)" if noted else "")
    accepted = "Accepted anyway (unsafe)" if datasource.allow_privileged_user else "Refused"
    return format_html(
        '<strong class="errornote paw-privileged">{}: {}</strong>', accepted, ", ".join(refused)
    )


class DatasourceAdminForm(forms.ModelForm):
    """The datasource's fields, refused when the connection reaches PAW's own database
    (``services.datasource_paw_database_check``) or, read-only, its database user can do
    more than read and that was not accepted (``services.datasource_privileges_enforce``)."""

    class Meta:
        model = Datasource
        fields = (
            "slug", "name", "description", "dialect", "connection", "read_only",
            "allow_privileged_user", "enabled", "access", "teams", "allowed_hosts",
            "sample_values", "sensitive_columns",
        )  # fmt: skip

    def _post_clean(self) -> None:
        super()._post_clean()
        if self.errors:
            return
        try:
            datasource_paw_database_check(datasource=self.instance)
        except DomainError as error:
            self.add_error("connection", error.detail)
            return
        try:
            datasource_privileges_enforce(datasource=self.instance)
            # Its teams' users are checked again with the settings as changed.
            for credential in (
                self.instance.credentials.select_related("team") if self.instance.pk else ()
            ):
                datasource_privileges_enforce(datasource=self.instance, credential=credential)
        except DomainError as error:
            self.add_error("allow_privileged_user", error.detail)


@admin.register(Datasource)
class DatasourceAdmin(PawModelAdmin):
    form = DatasourceAdminForm
    add_form_hidden_fields = ADD_FORM_HIDDEN_FIELDS | {
        "env_name",
        "schema_changes_shown",
        "stale_examples",
        "schema_progress",
    }
    list_display = (
        "slug",
        "name",
        "dialect",
        "read_only",
        "enabled",
        "access",
        "schema_refreshed_at",
        "stale_examples",
        "schema_progress",
        "updated_at",
    )
    list_filter = ("dialect", "enabled", "read_only", "access")
    filter_horizontal = ("teams",)
    search_fields = ("slug", "name", "description")
    readonly_fields = (
        "env_name",
        "privileges",
        "schema_requested_at",
        "schema_refreshed_at",
        "schema_progress",
        "schema_error",
        "schema_changes_shown",
        "stale_examples",
        "created_at",
        "updated_at",
    )
    fields = (
        "slug",
        "name",
        "description",
        "dialect",
        "connection",
        "read_only",
        "allow_privileged_user",
        "enabled",
        "access",
        "teams",
        "allowed_hosts",
        "sample_values",
        "sensitive_columns",
        *readonly_fields,
    )
    inlines = (DatasourceCredentialInline, KnowledgeEntryInline, SchemaEntryInline)
    actions = ("test_connection", "refresh_schema")

    @admin.display(description="Sandbox variable")
    def env_name(self, obj: Datasource) -> str:
        return obj.env_name if obj.slug else "-"

    @admin.display(description="Its database user, beyond reading")
    def privileges(self, obj: Datasource) -> str:
        """What the last check found the database user can do beyond reading; what PAW
        refuses (or was told to accept) in red."""
        return _privileges_text(obj, datasource=obj)

    @admin.display(description="Changed by the last schema refresh")
    def schema_changes_shown(self, obj: Datasource) -> str:
        """The last refresh's changes, one line each, and its re-check of the examples."""
        changes = obj.schema_changes or {}
        if not changes:
            return "-"
        lines = schema_diff_lines(changes) or ["Nothing changed."]
        examples = changes.get("examples")
        if examples:
            lines.append(
                f"Examples run again: {examples['checked']}, stale {examples['stale']}, no "
                f"longer stale {examples['unstaled']}, left for the next refresh "
                f"{examples['pending']}."
            )
        return format_html(
            '<div class="paw-schema-changes">At {}:<br>{}</div>',
            changes.get("at", "?"),
            format_html_join("", "{}<br>", ((line,) for line in lines)),
        )

    @admin.display(description="Stale examples")
    def stale_examples(self, obj: Datasource) -> int | str:
        """How many examples failed when the last refresh ran them again."""
        return datasource_stale_examples(obj) if obj.pk else "-"

    def get_queryset(self, request: HttpRequest) -> QuerySet[Datasource]:
        # The harvested structure is the refresh's own (large for a large schema).
        return datasources_with_stale_examples(super().get_queryset(request)).defer("schema_tables")

    def save_model(self, request: HttpRequest, obj: Datasource, form: Any, change: bool) -> None:
        datasource_save(datasource=obj)

    def get_inlines(self, request: HttpRequest, obj: Datasource | None) -> Any:
        # Knowledge belongs to a saved datasource: an example is checked against it.
        return self.inlines if obj is not None and obj.pk else ()

    def save_formset(self, request: HttpRequest, form: Any, formset: Any, change: bool) -> None:
        """Knowledge rows and team credentials through the services (checked by the forms
        already)."""
        if formset.model is DatasourceCredential:
            formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
            for credential_form in formset.initial_forms:
                if credential_form in formset.deleted_forms:
                    datasource_credential_delete(credential=credential_form.instance)
                    formset.deleted_objects.append(credential_form.instance)
            for credential_form in formset.forms:
                if credential_form in formset.deleted_forms or not credential_form.has_changed():
                    continue
                credential = credential_form.instance
                credential.datasource = form.instance
                new = credential.pk is None
                datasource_credential_save(credential=credential)
                if new:
                    formset.new_objects.append(credential)
                else:
                    formset.changed_objects.append((credential, credential_form.changed_data))
            return None
        if formset.model is not KnowledgeEntry:
            return super().save_formset(request, form, formset, change)
        # What formset.save() would note, for the admin's change message.
        formset.new_objects, formset.changed_objects, formset.deleted_objects = [], [], []
        for entry_form in formset.initial_forms:
            if entry_form in formset.deleted_forms:
                knowledge_entry_delete(entry=entry_form.instance)
                formset.deleted_objects.append(entry_form.instance)
        for entry_form in formset.forms:
            if entry_form in formset.deleted_forms or not entry_form.has_changed():
                continue
            data = entry_form.cleaned_data
            values = {
                "title": data["title"],
                "text": data.get("text") or "",
                "sql": "" if data["kind"] == KnowledgeEntry.Kind.DOC else data.get("sql") or "",
            }
            if entry_form.instance.pk is None:
                created = knowledge_entry_create(
                    datasource=form.instance,
                    kind=data["kind"],
                    user=request.user,
                    checked=True,
                    **values,
                )
                formset.new_objects.append(created)
            else:
                entry = KnowledgeEntry.objects.get(pk=entry_form.instance.pk)
                knowledge_entry_update(entry=entry, user=request.user, checked=True, **values)
                formset.changed_objects.append((entry, entry_form.changed_data))
        return None

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

    @admin.action(description="Refresh schema")
    def refresh_schema(self, request: HttpRequest, queryset: QuerySet[Datasource]) -> None:
        """Have a worker harvest each selected datasource's live schema (placeholders
        resolved there, for the operator) into its schema entries; each request is in the
        admin log (the datasource's history), as the admin's own writes are."""
        for datasource in queryset:
            datasource_schema_refresh_request(datasource=datasource, user=request.user)
            self.log_change(request, datasource, "Schema refresh requested.")
            self.message_user(
                request,
                f"Schema refresh of {datasource.slug} queued: its tables appear here when the "
                "worker is done (a failure is shown as the schema error).",
                messages.SUCCESS,
            )


@admin.register(KnowledgeEntry)
class KnowledgeEntryAdmin(PawModelAdmin):
    """Every entry of every datasource, to search through (edit them on the datasource)."""

    list_display = ("title", "kind", "datasource", "is_stale", "verified", "updated_at")
    list_filter = ("kind", StaleFilter, VerifiedFilter, "datasource")
    search_fields = ("title", "text", "sql")
    list_select_related = ("datasource", "verified_by")
    fields = (
        "datasource",
        "kind",
        "title",
        "text",
        "sql",
        "stale",
        "checked_at",
        "verification",
        "vector_model",
        "created_at",
        "updated_at",
    )
    readonly_fields = fields
    actions = ("mark_verified", "clear_verification")

    @admin.display(description="verified", boolean=True)
    def verified(self, obj: KnowledgeEntry) -> bool | None:
        """Examples only (None for the other kinds: no icon)."""
        return obj.verified_at is not None if obj.kind == KnowledgeEntry.Kind.EXAMPLE else None

    @admin.display(description="Verified")
    def verification(self, obj: KnowledgeEntry) -> str:
        return verification_text(obj)

    @admin.action(description="Mark the selected examples verified")
    def mark_verified(self, request: HttpRequest, queryset: QuerySet[KnowledgeEntry]) -> None:
        """Verify each selected example as the operator (a doc, a schema entry or a
        flagged example is refused, with the service's reason, and left as it was)."""
        self._each(
            request,
            queryset,
            "verified",
            lambda e: knowledge_entry_verify(entry=e, user=request.user),
        )

    @admin.action(description="Clear the verification of the selected examples")
    def clear_verification(self, request: HttpRequest, queryset: QuerySet[KnowledgeEntry]) -> None:
        """Clear each selected example's verification (others are refused)."""
        self._each(
            request, queryset, "no longer verified", lambda e: knowledge_entry_unverify(entry=e)
        )

    def _each(
        self, request: HttpRequest, queryset: QuerySet[KnowledgeEntry], done: str, act: Any
    ) -> None:
        for entry in queryset.select_related("datasource"):
            try:
                act(entry)
            except DomainError as error:
                self.message_user(request, f"{entry.title}: {error.detail}", messages.ERROR)
                continue
            self.log_change(request, entry, f"Example {done}.")
            self.message_user(request, f"{entry.title}: {done}.", messages.SUCCESS)

    @admin.display(description="Stale", boolean=True)
    def is_stale(self, obj: KnowledgeEntry) -> bool | None:
        return obj.stale_since is not None if obj.kind == KnowledgeEntry.Kind.EXAMPLE else None

    @admin.display(description="Stale")
    def stale(self, obj: KnowledgeEntry) -> str:
        """The database's error when the last refresh ran this example again."""
        return _stale_text(obj) or "-"

    def get_queryset(self, request: HttpRequest) -> QuerySet[KnowledgeEntry]:
        return super().get_queryset(request).defer("vector")

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(CustomProvider)
class CustomProviderAdmin(PawModelAdmin):
    list_display = (
        "name", "label", "base_url", "key_secret_name", "default_model", "vision", "enabled",
        "access",
    )  # fmt: skip
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}
    list_filter = ("enabled", "vision")
    search_fields = ("name", "label", "base_url")

    def save_model(
        self, request: HttpRequest, obj: CustomProvider, form: Any, change: bool
    ) -> None:
        custom_provider_save(provider=obj)

    @admin.display(description="access")
    def access(self, provider: CustomProvider) -> str:
        """Who may use it (its *Provider access* rule; none: everyone)."""
        (view,) = provider_access_list(provider=provider.name) or (None,)
        if view is None or view.access == "everyone":
            return "everyone"
        return "teams: " + (", ".join(name for _, name in view.teams) or "none (staff only)")


class ProviderAccessForm(forms.ModelForm):
    """A provider's rule: the provider chosen among those that exist (and the rule's own,
    when its custom provider was deleted since)."""

    provider = forms.ChoiceField(choices=())

    class Meta:
        model = ProviderAccess
        fields = ("provider", "access", "teams")
        widgets = {"teams": FilteredSelectMultiple("teams", is_stacked=False)}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [(name, f"{label} ({name})") for name, label in provider_names()]
        if self.instance.pk and self.instance.provider not in dict(choices):
            choices.append(
                (self.instance.provider, f"{self.instance.provider} (no such provider now)")
            )
        self.fields["provider"].choices = choices


class ProviderModelLimitInline(admin.TabularInline):
    """The teams limited to some of the provider's models (exact names)."""

    model = ProviderModelLimit
    fk_name = "access"
    extra = 0
    fields = ("team", "allowed_models")
    verbose_name = "team's models"
    verbose_name_plural = (
        "models per team (a team listed here may use only these models of the provider)"
    )


@admin.register(ProviderAccess)
class ProviderAccessAdmin(PawModelAdmin):
    """Who may use each provider through the operator's key: everyone (also a provider
    with no row here) or the members of its teams (staff always), and per team the only
    models it may use. A person's own key is theirs whatever this says."""

    form = ProviderAccessForm
    list_display = ("provider", "access", "team_names", "updated_at")
    list_filter = ("access",)
    search_fields = ("provider",)
    inlines = (ProviderModelLimitInline,)

    @admin.display(description="teams")
    def team_names(self, rule: ProviderAccess) -> str:
        return ", ".join(sorted(team.name for team in rule.teams.all())) or "-"

    def get_queryset(self, request: HttpRequest) -> QuerySet[ProviderAccess]:
        return super().get_queryset(request).prefetch_related("teams")


class TeamProviderAccessInline(admin.TabularInline):
    """On a team's page: the providers limited to teams that list this one."""

    model = ProviderAccess.teams.through
    extra = 0
    verbose_name = "provider limited to its teams"
    verbose_name_plural = "providers this team may use (of those limited to teams)"


class TeamModelLimitInline(admin.TabularInline):
    """On a team's page: the providers of which it may use only some models."""

    model = ProviderModelLimit
    fk_name = "team"
    extra = 0
    fields = ("access", "allowed_models")
    verbose_name = "model limit"
    verbose_name_plural = "model limits (the only models of a provider this team may use)"


TEAM_INLINES.extend((TeamProviderAccessInline, TeamModelLimitInline))


class TeamDatasourceInline(admin.TabularInline):
    """On a team's page: the datasources limited to teams that list this one (those open
    to everyone are every team's, and not listed)."""

    model = Datasource.teams.through
    fk_name = "group"
    extra = 0
    verbose_name = "datasource"
    verbose_name_plural = (
        "Datasources limited to teams that this team may use (those open to everyone are "
        "every team's too)"
    )


class TeamCredentialInline(admin.TabularInline):
    """On a team's page: its own credentials on datasources (edit them on the datasource,
    where they are checked)."""

    model = DatasourceCredential
    fk_name = "team"
    extra = 0
    max_num = 0
    can_delete = False
    verbose_name = "team credential"
    verbose_name_plural = "Its own database users on datasources (edited on the datasource)"
    fields = ("datasource", "db_user", "priority", "updated_at")
    readonly_fields = fields


TEAM_INLINES.extend([TeamDatasourceInline, TeamCredentialInline])
