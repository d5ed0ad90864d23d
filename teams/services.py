"""Writes of teams: create, rename, set members, delete; the default team of new accounts;
a person's teams from their identity provider's claim."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from paw_project.errors import Conflict, InvalidRequest
from teams.models import Team

logger = logging.getLogger(__name__)

#: The longest team name (``auth.Group.name``).
TEAM_NAME_MAX_LENGTH = 150


def _name_checked(name: str) -> str:
    name = name.strip()
    if not name:
        raise InvalidRequest("A team needs a name.", code="team_name_invalid")
    if len(name) > TEAM_NAME_MAX_LENGTH:
        raise InvalidRequest(
            f"A team's name is at most {TEAM_NAME_MAX_LENGTH} characters.",
            code="team_name_invalid",
        )
    return name


def _members(usernames: Iterable[str]) -> list[Any]:
    """The users named ``usernames`` (each once); ``InvalidRequest`` ``unknown_user``
    naming the first that has no account."""
    wanted = list(dict.fromkeys(usernames))
    found = {user.username: user for user in get_user_model().objects.filter(username__in=wanted)}
    for username in wanted:
        if username not in found:
            raise InvalidRequest(f"No user named {username!r}.", code="unknown_user")
    return [found[username] for username in wanted]


def _saved(team: Team) -> Team:
    taken = Conflict(f"A team named {team.name!r} exists.", code="team_name_taken")
    if Team.objects.filter(name__iexact=team.name).exclude(pk=team.pk).exists():
        raise taken
    try:
        with transaction.atomic():
            team.save()
    except IntegrityError as error:  # a concurrent create of the same name
        raise taken from error
    return team


@transaction.atomic
def team_create(*, name: str, members: Iterable[str] = ()) -> Team:
    """A new team ``name`` (unique ignoring case; 409 ``team_name_taken``) whose members
    are the users named ``members`` (400 ``unknown_user`` for one that does not exist;
    nothing is made then)."""
    users = _members(members)
    team = _saved(Team(name=_name_checked(name)))
    team.user_set.set(users)
    return team


@transaction.atomic
def team_update(
    *, team: Team, name: str | None = None, members: Iterable[str] | None = None
) -> Team:
    """Rename ``team`` and/or replace its members (the same errors as :func:`team_create`;
    nothing changes on one). Members left out lose what the team gave them at their next
    run."""
    users = _members(members) if members is not None else None
    if name is not None:
        team.name = _name_checked(name)
        _saved(team)
    if users is not None:
        team.user_set.set(users)
    return team


def team_delete(*, team: Team) -> None:
    """Delete ``team``: its members keep their accounts; what only it gave them (access,
    budgets) is gone."""
    team.delete()


def user_join_default_team(*, user: Any) -> None:
    """Add a new account to ``PAW_DEFAULT_TEAM`` when it names a team (made if missing);
    nothing when the setting is empty."""
    name = settings.PAW_DEFAULT_TEAM
    if not name:
        return
    team = Team.objects.filter(name__iexact=name).first()
    if team is None:
        try:
            team = _saved(Team(name=_name_checked(name)))
        except Conflict:  # made meanwhile by another sign-up
            team = Team.objects.get(name__iexact=name)
    team.user_set.add(user)


def user_teams_from_claim(*, user: Any, names: Iterable[str], create: bool = False) -> list[str]:
    """Set ``user``'s teams to the teams named in ``names`` (an identity provider's claim:
    any strings; each compared ignoring case). Names of no team are ignored, or make the
    team when ``create`` (``PAW_OIDC_CREATE_TEAMS``). Returns the names of the teams the
    user is now in."""
    wanted = [n.strip() for n in names if isinstance(n, str) and 0 < len(n.strip()) <= 150]
    teams: dict[int, Team] = {}
    for name in dict.fromkeys(wanted):
        team = Team.objects.filter(name__iexact=name).first()
        if team is None and create:
            try:
                team = _saved(Team(name=name))
            except Conflict:
                team = Team.objects.filter(name__iexact=name).first()
        if team is not None:
            teams[team.pk] = team
    user.groups.set(teams.values())
    logger.info(
        "teams of %s from the sign-in claim: %s",
        user.username,
        sorted(t.name for t in teams.values()),
    )
    return sorted(team.name for team in teams.values())
