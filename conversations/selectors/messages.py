"""The messages of a conversation's live channel, built from stored rows: what the
websocket sends (docs/api.md, "Websockets") and the channel layer carries."""

from __future__ import annotations

from typing import Any

from conversations.models import Approval, Run
from conversations.selectors.lineage import run_lineage_of


def event_message(event: Any) -> dict[str, Any]:
    """The client form of a stored event (a :class:`RunEvent` or an event just stored,
    ``conversations.services.events.StoredEvent``): ``{"cursor", "run_id", "event"}``."""
    return {
        "cursor": event.cursor,
        "run_id": str(event.run_id) if event.run_id else None,
        "event": event.payload,
    }


def run_status_message(run: Run) -> dict[str, Any]:
    """The ``run.status`` message for a run's current state."""
    return {
        "type": "run.status",
        "run_id": str(run.id),
        "status": run.status,
        "errors": run.errors,
        "model": run.model,
        "provider": run.provider,
        "usage": run.usage,
        # The earlier version of the turn this run answers anew (edit, regenerate), or None.
        "replaces": str(run.replaces_id) if run.replaces_id else None,
        "created_at": run.created_at.isoformat(),
        "started_at": run.started_at.isoformat() if run.started_at else None,
        "finished_at": run.finished_at.isoformat() if run.finished_at else None,
        # What a finished run's answer rests on (result.lineage), or None.
        "lineage": run_lineage_of(run),
    }


def approval_request_message(approval: Approval) -> dict[str, Any]:
    """The ``agent_confirm_request`` message for a pending approval."""
    message: dict[str, Any] = {
        "type": "agent_confirm_request",
        "approval_id": str(approval.id),
        "run_id": str(approval.run_id),
        "ask_id": approval.ask_id,
        "kind": approval.kind,
        "expires_at": approval.expires_at.isoformat(),
    }
    if approval.kind == Approval.Kind.CONFIRM:
        message["prompt"] = approval.prompt
        # The one call an approval allows (``None``: it allows no gated call): shown
        # beside the runtime's own prompt, so the person sees what PAW will hold it to.
        message["call"] = approval.call
    else:
        message["questions"] = approval.questions
    return message


def approval_resolved_message(approval: Approval) -> dict[str, Any]:
    """The ``agent_confirm_resolved`` message for a decided approval."""
    return {
        "type": "agent_confirm_resolved",
        "approval_id": str(approval.id),
        "run_id": str(approval.run_id),
        "ask_id": approval.ask_id,
        "status": approval.status,
        "decided_by": approval.decided_by,
        "answers": approval.answers,
    }


def pending_messages(*, conversation_id: Any) -> list[dict[str, Any]]:
    """What a newly connected tab must be told: the active run's ``run.status`` and an
    ``agent_confirm_request`` for each pending approval, oldest first."""
    runs = Run.objects.filter(conversation_id=conversation_id, status__in=Run.ACTIVE_STATUSES)
    approvals = Approval.objects.filter(
        conversation_id=conversation_id, status=Approval.Status.PENDING
    ).order_by("created_at", "id")
    return [run_status_message(run) for run in runs] + [
        approval_request_message(approval) for approval in approvals
    ]
