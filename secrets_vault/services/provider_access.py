"""Writes of who may use which provider and model (the rule itself is read in one place,
``secrets_vault.selectors.provider_grants``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib.auth.models import Group
from django.db import transaction

from paw_project.errors import InvalidRequest, NotFound
from secrets_vault.models import ProviderAccess, ProviderModelLimit
from secrets_vault.selectors import provider_names
from teams.models import Access

#: The most model names one team's limit may hold.
MODEL_LIMIT_MAX = 200
#: The longest model name (``Run.model``).
MODEL_NAME_MAX_LENGTH = 200


def _teams(team_ids: Iterable[int]) -> list[Group]:
    """The teams ``team_ids`` (each once); :class:`InvalidRequest` ``unknown_team`` naming
    the first id of no team."""
    wanted = list(dict.fromkeys(team_ids))
    found = Group.objects.in_bulk(wanted)
    for team_id in wanted:
        if team_id not in found:
            raise InvalidRequest(f"No team with id {team_id}.", code="unknown_team")
    return [found[team_id] for team_id in wanted]


def _model_names(models: Any, *, team: Group) -> list[str]:
    """A limit's model names: a non-empty list of distinct, non-blank strings
    (:class:`InvalidRequest` ``invalid_models`` otherwise, naming the team)."""
    if not isinstance(models, list) or not models or len(models) > MODEL_LIMIT_MAX:
        raise InvalidRequest(
            f"The models of team {team.name} are a list of 1 to {MODEL_LIMIT_MAX} model names.",
            code="invalid_models",
        )
    names = []
    for name in models:
        if not isinstance(name, str) or not name.strip() or len(name) > MODEL_NAME_MAX_LENGTH:
            raise InvalidRequest(
                f"The models of team {team.name} must be model names (1 to "
                f"{MODEL_NAME_MAX_LENGTH} characters).",
                code="invalid_models",
            )
        names.append(name.strip())
    return list(dict.fromkeys(names))


@transaction.atomic
def provider_access_set(
    *,
    provider: str,
    access: str | None = None,
    team_ids: Iterable[int] | None = None,
    model_limits: Iterable[dict[str, Any]] | None = None,
) -> ProviderAccess:
    """Set who may use ``provider`` through the operator's key: ``access`` (``everyone``
    | ``teams``), ``team_ids`` (the whole list of teams, for ``teams``) and
    ``model_limits`` (the whole list of ``{"team": id, "models": [name, ...]}``: the only
    models each team's members may use, :func:`~secrets_vault.selectors.provider_grants`).
    What is not given stays as it was; a provider without a rule starts as ``everyone``
    with no limits.

    Raises :class:`NotFound` ``provider_not_found`` when ``provider`` is neither a
    provider now (:func:`~secrets_vault.selectors.provider_names`) nor a rule's;
    :class:`InvalidRequest` ``unknown_team`` (an id of no team), ``invalid_models``,
    ``invalid_choice`` (an unknown ``access``). Nothing changes on an error."""
    rule = ProviderAccess.objects.select_for_update().filter(provider=provider).first()
    if rule is None and provider not in dict(provider_names()):
        raise NotFound(f"No provider named {provider!r}.", code="provider_not_found")
    if access is not None and access not in Access.values:
        raise InvalidRequest(f"access is one of {', '.join(Access.values)}.", code="invalid_choice")
    teams = _teams(team_ids) if team_ids is not None else None
    limits = None
    if model_limits is not None:
        limits = []
        for item in model_limits:
            if not isinstance(item, dict) or set(item) != {"team", "models"}:
                raise InvalidRequest(
                    'A model limit is {"team": id, "models": [name, ...]}.', code="invalid_models"
                )
            (team,) = _teams([item["team"]])
            limits.append((team, _model_names(item["models"], team=team)))
        if len({team.pk for team, _ in limits}) != len(limits):
            raise InvalidRequest("One model limit per team.", code="invalid_models")
    if rule is None:
        rule = ProviderAccess(provider=provider)
    if access is not None:
        rule.access = access
    rule.save()
    if teams is not None:
        rule.teams.set(teams)
    if limits is not None:
        ProviderModelLimit.objects.filter(access=rule).delete()
        ProviderModelLimit.objects.bulk_create(
            ProviderModelLimit(access=rule, team=team, allowed_models=names)
            for team, names in limits
        )
    return rule
