"""Writes of teams: create, rename, set members, delete; the default team of new accounts;
a person's teams from their identity provider's claim."""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import IntegrityError, transaction

from paw_project.errors import Conflict, InvalidRequest
from teams.models import Team, TeamName, team_name_key

logger = logging.getLogger(__name__)

#: The longest team name (``auth.Group.name``).
TEAM_NAME_MAX_LENGTH = 150


#: Unicode categories a team name may not hold: control (``Cc``) and format (``Cf``:
#: zero-width spaces and joiners, direction marks, the BOM) characters, which make
#: invisible lookalikes of another team's name.
_REFUSED_CATEGORIES = frozenset({"Cc", "Cf"})


def team_name_normalized(name: str) -> str:
    """``name`` as a team's name: NFC, stripped, 1 to :data:`TEAM_NAME_MAX_LENGTH`
    characters, no control or format character; else ``InvalidRequest``
    ``team_name_invalid``."""
    name = unicodedata.normalize("NFC", name).strip()
    if not name:
        raise InvalidRequest("A team needs a name.", code="team_name_invalid")
    if len(name) > TEAM_NAME_MAX_LENGTH:
        raise InvalidRequest(
            f"A team's name is at most {TEAM_NAME_MAX_LENGTH} characters.",
            code="team_name_invalid",
        )
    if any(unicodedata.category(char) in _REFUSED_CATEGORIES for char in name):
        raise InvalidRequest(
            "A team's name may not hold control or invisible (format) characters.",
            code="team_name_invalid",
        )
    return name


def team_name_clash(name: str, *, exclude_pk: int | None = None) -> bool:
    """Whether a team other than ``exclude_pk`` has a name equal to ``name`` ignoring
    case (its :func:`teams.models.team_name_key`)."""
    return TeamName.objects.filter(key=team_name_key(name)).exclude(team_id=exclude_pk).exists()


def team_by_name(name: str) -> Team | None:
    """The one team whose name equals ``name`` ignoring case (the key's unique index
    makes it at most one), else ``None``."""
    return Team.objects.filter(name_key__key=team_name_key(name)).first()


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
    """Save ``team`` (its name normalized already); 409 ``team_name_taken`` when another
    team has its name ignoring case, checked first and then by the name key's unique
    index (two concurrent creates: one wins)."""
    taken = Conflict(f"A team named {team.name!r} exists.", code="team_name_taken")
    if team_name_clash(team.name, exclude_pk=team.pk):
        raise taken
    try:
        with transaction.atomic():
            team.save()  # its name key too (``teams.apps.team_name_keep``): unique
    except IntegrityError as error:  # a concurrent create of the same name
        raise taken from error
    return team


@transaction.atomic
def team_create(*, name: str, members: Iterable[str] = ()) -> Team:
    """A new team ``name`` (unique ignoring case; 409 ``team_name_taken``) whose members
    are the users named ``members`` (400 ``unknown_user`` for one that does not exist;
    nothing is made then)."""
    users = _members(members)
    team = _saved(Team(name=team_name_normalized(name)))
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
        team.name = team_name_normalized(name)
        _saved(team)
    if users is not None:
        team.user_set.set(users)
    return team


def team_delete(*, team: Team) -> None:
    """Delete ``team``: its members keep their accounts; what only it gave them (access,
    budgets) is gone."""
    team.delete()


def user_join_default_team(*, user: Any) -> None:
    """Add a new account to ``PAW_DEFAULT_TEAM``: the one team of that name ignoring case
    (its key), made if missing; nothing when the setting is empty."""
    name = settings.PAW_DEFAULT_TEAM
    if not name:
        return
    team = team_by_name(team_name_normalized(name))
    if team is None:
        try:
            team = _saved(Team(name=team_name_normalized(name)))
        except Conflict:  # made meanwhile by another sign-up
            team = team_by_name(name)
        if team is None:  # pragma: no cover - deleted again at once
            return
    team.user_set.add(user)


def user_teams_from_claim(*, user: Any, names: Iterable[str], create: bool = False) -> list[str]:
    """Set ``user``'s teams to the teams named in ``names`` (an identity provider's claim:
        any strings; each normalized as a team's name and compared on its key, ignoring case;
    an invalid one ignored). Names of no team are ignored, or make the
        team when ``create`` (``PAW_OIDC_CREATE_TEAMS``). Returns the names of the teams the
        user is now in."""
    teams: dict[int, Team] = {}
    for raw in names:
        if not isinstance(raw, str):
            continue
        try:
            name = team_name_normalized(raw)
        except InvalidRequest:  # blank, too long, or with invisible characters
            continue
        team = team_by_name(name)
        if team is None and create:
            try:
                team = _saved(Team(name=name))
            except Conflict:
                team = team_by_name(name)
        if team is not None:
            teams[team.pk] = team
    user.groups.set(teams.values())
    logger.info(
        "teams of %s from the sign-in claim: %s",
        user.username,
        sorted(t.name for t in teams.values()),
    )
    return sorted(team.name for team in teams.values())
