"""A team is a Django ``auth.Group`` (:class:`Team` is its proxy, for the admin and the
API's words); :class:`AccessRuled` is the access setting other apps' models carry
(datasources, providers, tool servers): ``everyone`` or the members of listed teams."""

from __future__ import annotations

import unicodedata

from django.contrib.auth.models import Group
from django.db import models


class Team(Group):
    """A Django group, under the name PAW gives it: its members are the group's users."""

    class Meta:
        proxy = True
        verbose_name = "team"
        verbose_name_plural = "teams"


def team_name_key(name: str) -> str:
    """The key two team names clash on: NFC of the casefolded NFC name, stripped
    (``Équipe``/``équipe``, ``Straße``/``STRASSE``, composed/decomposed accents: one
    key)."""
    return unicodedata.normalize("NFC", unicodedata.normalize("NFC", name.strip()).casefold())


class TeamName(models.Model):
    """A team's name key (:func:`team_name_key`), unique: the database's guard that no
    two teams' names are equal ignoring case, on PostgreSQL and SQLite alike.

    Why a row of its own, not an index on ``auth_group``: that table is Django's (a
    migration of ours on it would be one of ``auth``'s tables changed from outside), and
    ``lower(name)`` folds ASCII only on SQLite and knows neither casefolding (``ß``) nor
    Unicode normalization on either — a key computed in Python is the same on both
    backends, and a plain unique index on it makes concurrent creates of ``Race`` and
    ``RACE`` end in one team and one ``IntegrityError``. It is kept in step by a
    ``post_save`` of every group (:func:`teams.apps.team_name_keep`: services, admin,
    shell, fixtures alike); deleting the group deletes it."""

    team = models.OneToOneField(
        Group, on_delete=models.CASCADE, primary_key=True, related_name="name_key"
    )
    key = models.CharField(max_length=600, unique=True)

    class Meta:
        verbose_name = "team name key"

    def __str__(self) -> str:
        return self.key


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
