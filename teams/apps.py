"""The teams app; keeps each group's :class:`teams.models.TeamName` in step with its
name."""

from __future__ import annotations

from typing import Any

from django.apps import AppConfig


def team_name_keep(sender: Any, instance: Any, raw: bool = False, **kwargs: Any) -> None:
    """After a group is saved: its name key, made or updated. A key another team holds
    raises ``IntegrityError`` (the unique index), so the save that would make a second
    ``Ops`` fails whichever path it took; :func:`teams.services._saved` turns it into 409
    ``team_name_taken``."""
    from teams.models import TeamName, team_name_key

    if raw:  # loaddata: the fixture carries its own rows
        return
    TeamName.objects.update_or_create(
        team_id=instance.pk, defaults={"key": team_name_key(instance.name)}
    )


class TeamsConfig(AppConfig):
    """Teams: Django's ``auth.Group`` as the unit of access (who may use which datasource,
    model and budget), with the rule of an access setting in one place."""

    name = "teams"
    verbose_name = "Teams"

    def ready(self) -> None:
        """Connect :func:`team_name_keep` to saves of groups and of teams (a proxy's
        saves are sent under its own class)."""
        from django.contrib.auth.models import Group
        from django.db.models.signals import post_save

        from teams.models import Team

        for model in (Group, Team):
            post_save.connect(
                team_name_keep, sender=model, dispatch_uid=f"team_name_keep_{model.__name__}"
            )
