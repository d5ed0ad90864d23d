"""A team is a Django ``auth.Group`` (:class:`Team` is its proxy, for the admin and the
API's words); :class:`AccessRuled` is the access setting other apps' models carry
(datasources, providers, tool servers): ``everyone`` or the members of listed teams."""

from __future__ import annotations

from django.contrib.auth.models import Group
from django.db import models


class Team(Group):
    """A Django group, under the name PAW gives it: its members are the group's users."""

    class Meta:
        proxy = True
        verbose_name = "team"
        verbose_name_plural = "teams"


class Access(models.TextChoices):
    """Who may use a thing: every signed-in person, or the members of its teams (and staff
    always)."""

    EVERYONE = "everyone", "Everyone signed in"
    TEAMS = "teams", "Members of its teams (and staff)"


class AccessRuled(models.Model):
    """Abstract: an ``access`` rule and its ``teams``. A new row starts as ``teams`` with no
    team — staff only — until an operator says otherwise. Read the rule only through
    :func:`teams.selectors.accessible` (one rule, one place)."""

    access = models.CharField(
        max_length=16,
        choices=Access.choices,
        default=Access.TEAMS,
        help_text="Everyone signed in, or only the members of the teams below (staff always).",
    )
    teams = models.ManyToManyField(
        Group,
        blank=True,
        related_name="+",
        help_text="The teams whose members may use it, when access is limited to teams.",
    )

    class Meta:
        abstract = True
