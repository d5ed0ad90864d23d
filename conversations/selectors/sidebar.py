"""Reads for the conversation list (the chat page's sidebar): a conversation's live state
as the per-user websocket sends it, its pending approvals, and full-text search."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from django.db import connection
from django.db.models import Exists, JSONField, OuterRef, Prefetch, Q, QuerySet
from django.db.models.expressions import RawSQL
from django.utils import timezone

from conversations.models import Approval, Conversation, Run

#: Longest ``search`` accepted (characters).
MAX_SEARCH_CHARS = 200
#: Characters of context either side of a match in a search result's snippet.
SNIPPET_CONTEXT = 60


def _iso(value: Any) -> str | None:
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


# PostgreSQL: the statement of ``ArraySubquery(Approval.objects.filter(conversation=OuterRef(
# "pk"), status="pending", expires_at__gt=now).order_by("created_at", "id").values(json=
# JSONObject(id="id", kind="kind", expires_at="expires_at")))``, written once: Django builds,
# resolves and compiles that expression anew on every request, about half a millisecond of
# CPU per conversation list (bench/api.py). It names the outer table, so it holds only at the
# top level of a query (Django renames the tables of a nested one).
_PENDING_APPROVALS_SQL = (
    "ARRAY(SELECT JSONB_BUILD_OBJECT("
    """'id', "approval"."id", 'kind', "approval"."kind", 'expires_at', "approval"."expires_at") """
    'FROM "conversations_approval" "approval" '
    'WHERE "approval"."conversation_id" = "conversations_conversation"."id" '
    'AND "approval"."status" = %s AND "approval"."expires_at" > %s '
    'ORDER BY "approval"."created_at" ASC, "approval"."id" ASC)'
)


def with_pending_approvals(queryset: QuerySet[Conversation]) -> QuerySet[Conversation]:
    """``queryset`` (a top-level query on conversations, e.g.
    ``conversations.selectors.conversations.conversation_list``) with each conversation's
    pending approvals still within their deadline (oldest first) for
    :func:`pending_approvals_of`: on PostgreSQL in the same query (an array subquery,
    annotated ``pending_approvals_json``), elsewhere one more query for the page (a
    prefetch into ``pending_approval_list``)."""
    now = timezone.now()
    if connection.vendor == "postgresql":
        from django.contrib.postgres.fields import ArrayField

        return queryset.annotate(
            pending_approvals_json=RawSQL(  # noqa: S611 - constant SQL, values are parameters
                _PENDING_APPROVALS_SQL,
                [str(Approval.Status.PENDING), now],
                output_field=ArrayField(JSONField()),
            )
        )
    pending = Approval.objects.filter(status=Approval.Status.PENDING, expires_at__gt=now).order_by(
        "created_at", "id"
    )
    return queryset.prefetch_related(
        Prefetch("approvals", queryset=pending, to_attr="pending_approval_list")
    )


def pending_approvals_of(conversation: Conversation) -> list[dict[str, Any]]:
    """``[{"id", "kind", "expires_at"}]`` (ISO 8601 UTC) of the conversation's pending
    approvals still within their deadline; uses :func:`with_pending_approvals` when it was
    applied, else one query."""
    annotated = getattr(conversation, "pending_approvals_json", None)
    if annotated is not None:
        return [
            {
                "id": str(row["id"]),
                "kind": row["kind"],
                "expires_at": _iso(datetime.fromisoformat(row["expires_at"]).astimezone(UTC)),
            }
            for row in annotated
        ]
    approvals = getattr(conversation, "pending_approval_list", None)
    if approvals is None:
        approvals = Approval.objects.filter(
            conversation_id=conversation.id,
            status=Approval.Status.PENDING,
            expires_at__gt=timezone.now(),
        ).order_by("created_at", "id")
    return [{"id": str(a.id), "kind": a.kind, "expires_at": _iso(a.expires_at)} for a in approvals]


def conversation_live_state(*, conversation_id: UUID) -> tuple[int, dict[str, Any]] | None:
    """``(user id, state)`` of a conversation for its owner's sidebar, read now, or
    ``None`` when it no longer exists. ``state``: ``{"id", "title", "active",
    "active_run_id", "pending_approvals": [{"id", "kind", "expires_at"}], "last_activity",
    "created", "as_of"}`` — times ISO 8601 UTC, ``as_of`` the read's Unix time (seconds),
    so a client can drop a state older than one it applied."""
    conversation = (
        Conversation.objects.filter(id=conversation_id)
        .only("id", "user_id", "title", "last_activity_at", "created_at")
        .first()
    )
    if conversation is None:
        return None
    active = (
        Run.objects.filter(conversation_id=conversation_id, status__in=Run.ACTIVE_STATUSES)
        .values_list("id", flat=True)
        .first()
    )
    pending = pending_approvals_of(conversation)
    state = {
        "id": str(conversation.id),
        "title": conversation.title,
        "active": active is not None,
        "active_run_id": str(active) if active else None,
        "pending_approvals": pending,
        "last_activity": _iso(conversation.last_activity_at),
        "created": _iso(conversation.created_at),
        "as_of": time.time(),
    }
    return conversation.user_id, state


def search_terms(search: str) -> list[str]:
    """The words of a search (letters and digits, lower-cased, at most 20 of them)."""
    return [w.lower() for w in re.findall(r"\w+", search)][:20]


def conversations_search(queryset: QuerySet[Conversation], *, search: str) -> QuerySet:
    """``queryset`` narrowed to the conversations whose title, or a prompt or answer of
    one of their runs, matches ``search``: PostgreSQL full-text search (``websearch``
    syntax, English stemming, or the plain words in the ``simple`` configuration), on
    SQLite (embedded mode) every word as a case-insensitive substring. The caller bounds
    the length (:data:`MAX_SEARCH_CHARS`)."""
    if connection.vendor == "postgresql":
        from django.contrib.postgres.search import SearchQuery, SearchVector

        matches = Q()
        for config in ("english", "simple"):
            query = SearchQuery(search, search_type="websearch", config=config)
            runs = (
                Run.objects.filter(conversation=OuterRef("pk"))
                .annotate(
                    document=SearchVector("prompt", config=config)
                    + SearchVector("answer", config=config)
                )
                .filter(document=query)
            )
            titled = Conversation.objects.annotate(
                document=SearchVector("title", config=config)
            ).filter(pk=OuterRef("pk"), document=query)
            matches |= Q(Exists(titled)) | Q(Exists(runs))
        return queryset.filter(matches)
    terms = search_terms(search)
    if not terms:
        return queryset.none()
    for term in terms:
        runs = Run.objects.filter(conversation=OuterRef("pk")).filter(
            Q(prompt__icontains=term) | Q(answer__icontains=term)
        )
        queryset = queryset.filter(Q(title__icontains=term) | Q(Exists(runs)))
    return queryset


def search_match(conversation: Conversation, *, search: str) -> dict[str, str] | None:
    """Where a search result matched, for its snippet: ``{"field": "title" | "prompt" |
    "answer", "text"}``, ``text`` up to :data:`SNIPPET_CONTEXT` characters either side of
    the first word of ``search`` found (``None``: no word found as written, e.g. a stemmed
    match). One query."""
    terms = search_terms(search)
    if not terms:
        return None
    pattern = re.compile("|".join(re.escape(t) for t in sorted(terms, key=len, reverse=True)), re.I)
    if pattern.search(conversation.title or ""):
        return {"field": "title", "text": conversation.title}
    runs = Run.objects.filter(conversation_id=conversation.id)
    word = Q()
    for term in terms:
        word |= Q(prompt__icontains=term) | Q(answer__icontains=term)
    for prompt, answer in (
        runs.filter(word).order_by("created_at").values_list("prompt", "answer")[:5]
    ):
        for field, text in (("prompt", prompt), ("answer", answer)):
            found = pattern.search(text or "")
            if found:
                start = max(0, found.start() - SNIPPET_CONTEXT)
                end = min(len(text), found.end() + SNIPPET_CONTEXT)
                snippet = " ".join(text[start:end].split())
                prefix = "…" if start else ""
                suffix = "…" if end < len(text) else ""
                return {"field": field, "text": f"{prefix}{snippet}{suffix}"}
    return None
