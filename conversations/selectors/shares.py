"""Reads of shared conversations: who may see a share, what its snapshot holds.

A share (:class:`~conversations.models.Share`) is seen by its audience only — the
members of its teams (``teams``) or every signed-in person (``signed_in``) — and by its
owner; for anyone else, and once it expired, was stopped, ``PAW_SHARING`` no longer
allows its audience, its owner was deactivated or (``teams``) is a member of none of its
teams any more, it does not exist (``NotFound``, one answer for all of these, so a
share's id cannot be probed).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Q, QuerySet
from django.utils import timezone

from accounts.models import User
from conversations.models import Approval, Run, RunEvent, Share
from conversations.selectors.artifacts import OpenArtifact, content_type_for
from conversations.selectors.conversations import conversation_get
from conversations.selectors.workspaces import share_file_open
from paw_project.errors import NotFound
from teams.selectors import user_team_ids

#: How wide each ``PAW_SHARING`` value lets a share be (an audience needs at most it).
SHARING_WIDTH = {"off": 0, "teams": 1, "signed_in": 2}
AUDIENCE_WIDTH = {Share.Audience.TEAMS: 1, Share.Audience.SIGNED_IN: 2}
#: Events of a snapshot read at a time.
CHUNK_EVENTS = 500
#: Bytes of event payloads one page of a share's events holds at most (at least one).
EVENTS_MAX_BYTES = 1 << 20
#: Approvals a share's JSON names at most (how each question or confirm was decided).
MAX_APPROVALS = 1000


def sharing_allows(audience: str) -> bool:
    """Whether ``PAW_SHARING`` (the widest audience allowed) allows ``audience``."""
    return AUDIENCE_WIDTH.get(audience, 99) <= SHARING_WIDTH.get(settings.PAW_SHARING, 0)


def share_team_ids(share: Share) -> list[int]:
    """The ids of the share's teams its owner is still a member of, sorted: only those
    see it (a team the owner left, or one deleted, is no longer of its audience). Empty
    for ``signed_in``. Worked out once per share object."""
    cached = getattr(share, "_owner_team_ids", None)
    if cached is None:
        owner_teams = user_team_ids(share.conversation.user)
        cached = sorted(team.id for team in share.teams.all() if team.id in owner_teams)
        share._owner_team_ids = cached
    return cached


def share_status(share: Share, *, now: datetime | None = None) -> str:
    """``active``, ``expired`` (past ``expires_at``) or ``not_allowed`` (``PAW_SHARING``
    no longer allows its audience, its owner was deactivated, or a ``teams`` share has
    no team left that its owner is a member of): only an active share can be seen."""
    if not sharing_allows(share.audience) or not share.conversation.user.is_active:
        return "not_allowed"
    if share.audience == Share.Audience.TEAMS and not share_team_ids(share):
        return "not_allowed"
    if share.expires_at is not None and share.expires_at <= (now or timezone.now()):
        return "expired"
    return "active"


def share_list(*, user: User) -> QuerySet[Share]:
    """The user's shares across their conversations (*Shared by me*), newest first, with
    their conversation and teams loaded."""
    return (
        Share.objects.filter(conversation__user=user)
        .select_related("conversation__user")
        .prefetch_related("teams")
        .order_by("-created_at", "-id")
    )


def conversation_share_list(*, user: User, conversation_id: UUID | str) -> QuerySet[Share]:
    """The shares of the user's conversation, newest first. Raises ``NotFound`` (404) for
    a conversation that is not the user's."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    return share_list(user=user).filter(conversation=conversation)


def conversation_share_get(
    *, user: User, conversation_id: UUID | str, share_id: UUID | str, for_update: bool = False
) -> Share:
    """One share of the user's conversation (``for_update``: row-locked). Raises
    ``NotFound`` (404) for another user's conversation or a share not of it."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    shares = Share.objects.select_for_update(of=("self",)) if for_update else Share.objects
    share = (
        shares.select_related("conversation__user")
        .filter(conversation=conversation, id=share_id)
        .first()
    )
    if share is None:
        raise NotFound("No such share.", code="not_found")
    return share


def share_for_viewer(*, user: User, share_id: UUID | str) -> Share:
    """The share ``share_id`` as ``user`` may see it: active (:func:`share_status`) and
    ``user`` its owner or in its audience (a member of one of its teams that its owner is
    still a member of, for ``teams``; anyone signed in, for ``signed_in``). Raises
    ``NotFound`` (404) otherwise, the same answer as for a share that does not exist."""
    missing = NotFound("No such share.", code="not_found")
    if not user.is_authenticated:
        raise missing
    try:
        share = Share.objects.select_related("conversation__user").get(id=share_id)
    except (Share.DoesNotExist, ValidationError, ValueError, TypeError) as error:
        raise missing from error
    if share_status(share) != "active":
        raise missing
    if share.conversation.user_id == user.pk or share.audience == Share.Audience.SIGNED_IN:
        return share
    if share.audience == Share.Audience.TEAMS and set(share_team_ids(share)) & user_team_ids(user):
        return share
    raise missing


def share_runs(share: Share) -> QuerySet[Run]:
    """The snapshot's runs (those that had finished when it was taken), oldest first."""
    return share.runs.order_by("created_at", "id")


def _share_events(share: Share) -> QuerySet[RunEvent]:
    return RunEvent.objects.filter(
        Q(run__isnull=True) | Q(run__in=share.runs.values("id")),
        conversation_id=share.conversation_id,
        cursor__lte=share.cursor,
    ).order_by("cursor")


def share_event_page(
    share: Share, *, after: int, limit: int, max_bytes: int = EVENTS_MAX_BYTES
) -> tuple[list[RunEvent], bool]:
    """``(events, has_more)``: up to ``limit`` events of the snapshot with ``cursor >
    after``, in cursor order, their payloads within ``max_bytes`` (at least one);
    ``has_more`` when more follow the last one."""
    events: list[RunEvent] = []
    size = 0
    for event in _share_events(share).filter(cursor__gt=after)[: limit + 1].iterator(chunk_size=50):
        if len(events) >= limit:
            return events, True
        event_size = len(json.dumps(event.payload, ensure_ascii=False))
        if events and size + event_size > max_bytes:
            return events, True
        events.append(event)
        size += event_size
    return events, False


def share_events_all(share: Share) -> Iterator[RunEvent]:
    """Every event of the snapshot in cursor order, read in chunks (a fork copies them)."""
    return _share_events(share).iterator(chunk_size=CHUNK_EVENTS)


def share_approvals(share: Share) -> list[Approval]:
    """How the snapshot's questions and confirms were decided (at most
    :data:`MAX_APPROVALS`), oldest first."""
    return list(
        Approval.objects.filter(run__in=share.runs.values("id"))
        .exclude(ask_id="")
        .order_by("created_at", "id")[:MAX_APPROVALS]
    )


def share_file_entry(share: Share, path: str) -> dict[str, Any] | None:
    """The snapshot's entry of the file at ``path`` (``{"path", "size", "upload",
    "sha256"}``), or ``None`` when the snapshot holds no such file."""
    return next((entry for entry in share.files if entry.get("path") == path), None)


def share_file_get(*, user: User, share_id: UUID | str, path: str) -> OpenArtifact:
    """Open the snapshot's copy of the file at ``path`` for download. Raises ``NotFound``
    (404) when the share is not ``user``'s to see (:func:`share_for_viewer`) or holds no
    such file."""
    share = share_for_viewer(user=user, share_id=share_id)
    opened = (
        share_file_open(share.id, share.snapshot, path)
        if share_file_entry(share, path) is not None
        else None
    )
    if opened is None:
        raise NotFound("No such file in this share.", code="not_found")
    file, size = opened
    name = path.rsplit("/", 1)[-1]
    return OpenArtifact(file=file, name=name, size=size, content_type=content_type_for(name))
