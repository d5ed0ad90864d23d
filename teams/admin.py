"""The admin's *Teams*: Django's groups under PAW's name, with their members on the team's
own page (Django's group page lists permissions only). Other apps add, on a team, what it
may use (inlines registered through :data:`TEAM_INLINES`)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin.widgets import FilteredSelectMultiple
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import GroupAdmin
from django.contrib.auth.models import Group

from paw_project.errors import InvalidRequest
from teams.models import Team
from teams.services import team_name_clash, team_name_normalized

#: Inlines other apps show on a team's page (what it may use, its budget), appended by
#: their admin modules (an app below ``teams`` would otherwise have to import them).
TEAM_INLINES: list[type[admin.options.InlineModelAdmin]] = []


class TeamForm(forms.ModelForm):
    """A team's name, permissions and members. The name is normalized as the services
    do (:func:`teams.services.team_name_normalized`) and refused with a form error when
    another team has it ignoring case; the name key itself follows the save
    (``teams.apps.team_name_keep``)."""

    members = forms.ModelMultipleChoiceField(
        queryset=get_user_model().objects.order_by("username"),
        required=False,
        widget=FilteredSelectMultiple("members", is_stacked=False),
    )

    class Meta:
        model = Team
        fields = ("name", "permissions", "members")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk:
            self.fields["members"].initial = self.instance.user_set.all()

    def clean_name(self) -> str:
        """The name, normalized; a form error when invalid or another team's."""
        try:
            name = team_name_normalized(self.cleaned_data["name"])
        except InvalidRequest as error:
            raise forms.ValidationError(str(error.detail), code="team_name_invalid") from error
        if team_name_clash(name, exclude_pk=self.instance.pk):
            raise forms.ValidationError(
                f"A team named {name!r} exists (names are unique ignoring case).",
                code="team_name_taken",
            )
        return name

    def _save_m2m(self) -> None:
        super()._save_m2m()
        self.instance.user_set.set(self.cleaned_data["members"])


admin.site.unregister(Group)


@admin.register(Team)
class TeamAdmin(GroupAdmin):
    """Teams with their members (and, from other apps, what each may use)."""

    form = TeamForm
    list_display = ("name", "member_count")
    fieldsets = (
        (None, {"fields": ("name", "members")}),
        ("Permissions", {"fields": ("permissions",), "classes": ("collapse",)}),
    )

    def get_inlines(self, request: Any, obj: Any) -> list[Any]:
        return list(TEAM_INLINES)

    @admin.display(description="members")
    def member_count(self, team: Team) -> int:
        return team.user_set.count()
