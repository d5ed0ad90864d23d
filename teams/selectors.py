"""Reads of teams and the one access rule (who may use what)."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AnonymousUser, Group
from django.db.models import Q, QuerySet

from teams.models import Access, Team

#: What a person is, for these reads: a user, or an anonymous one (who is in no team).
Person = Any


def user_team_ids(user: Person) -> frozenset[int]:
    """The ids of the teams ``user`` is a member of now (empty for an anonymous user or
    ``None``). One query."""
    if user is None or isinstance(user, AnonymousUser) or not user.is_authenticated:
        return frozenset()
    return frozenset(Group.objects.filter(user=user).values_list("id", flat=True))


def user_teams(user: Person) -> QuerySet[Team]:
    """The teams ``user`` is a member of, by name (one query)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return Team.objects.none()
    return Team.objects.filter(user=user).order_by("name")


def team_list() -> QuerySet[Team]:
    """Every team, by name, with its members prefetched."""
    return Team.objects.order_by("name").prefetch_related("user_set")


def team_get(team_id: int) -> Team | None:
    """The team ``team_id``, or ``None``."""
    return team_list().filter(id=team_id).first()


def access_q(user: Person, *, prefix: str = "") -> Q:
    """The filter of the rows of an :class:`~teams.models.AccessRuled` model that ``user``
    may use: those open to everyone, and those listing one of ``user``'s teams. Staff and
    superusers may use all; an anonymous user none. ``prefix`` is the path to the ruled
    model in a related lookup (e.g. ``"datasource__"``)."""
    if user is None or not getattr(user, "is_authenticated", False):
        return Q(pk__in=[])
    if user.is_staff or user.is_superuser:
        return Q()
    rule = Q(**{f"{prefix}access": Access.EVERYONE})
    team_ids = user_team_ids(user)
    if team_ids:
        rule |= Q(**{f"{prefix}access": Access.TEAMS, f"{prefix}teams__in": team_ids})
    return rule


def accessible(queryset: QuerySet, user: Person) -> QuerySet:
    """``queryset`` (of an :class:`~teams.models.AccessRuled` model) less what ``user`` may
    not use (:func:`access_q`); each row once, however many of its teams the user is in."""
    rule = access_q(user)
    if not rule:  # staff: everything, no join
        return queryset
    return queryset.filter(pk__in=queryset.model.objects.filter(rule).values("pk"))


def may_use(obj: Any, user: Person) -> bool:
    """Whether ``user`` may use ``obj`` (an :class:`~teams.models.AccessRuled` row), by
    the same rule as :func:`accessible`."""
    return accessible(type(obj).objects.filter(pk=obj.pk), user).exists()
