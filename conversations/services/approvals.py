"""Approvals: the agent's questions (``ask``) and requests to confirm a risky action.

An approval is created when the runtime sends ``notify ask`` and is decided exactly once:
by a person (websocket or API, whichever comes first: the row lock decides), by the
conversation's auto-approve toggle (confirms only), or by its deadline (a confirm is
declined, a question answered "Unanswered"). The decision becomes an ``answer`` op to
the runtime, written by the node that owns the sandbox.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from conversations.models import Approval, Run
from conversations.services.events import message_publish
from paw_project.errors import Conflict, InvalidRequest, NotFound

logger = logging.getLogger(__name__)

#: What an expired question is answered with (the model is told nobody answered).
UNANSWERED = "Unanswered"
MAX_ANSWERS = 20
MAX_ANSWER_CHARS = 10_000


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


def approval_answers(approval: Approval) -> list[str]:
    """The ``answers`` of the ``answer`` op that carries a decided approval to the runtime
    (a confirm: ``["yes"]`` or ``["no"]``, PROTOCOL.md)."""
    if approval.kind == Approval.Kind.CONFIRM:
        return ["yes" if approval.status == Approval.Status.APPROVED else "no"]
    return list(approval.answers) or [UNANSWERED]


def _normalize_questions(data: dict[str, Any]) -> list[dict[str, Any]]:
    questions = []
    for item in data.get("questions") or []:
        if not isinstance(item, dict):
            continue
        options = []
        for option in item.get("options") or []:
            if isinstance(option, str):
                options.append(option[:500])
            elif isinstance(option, dict) and isinstance(option.get("label"), str):
                options.append(
                    {
                        "label": option["label"][:500],
                        "description": str(option.get("description") or "")[:2000],
                    }
                )
        questions.append(
            {"question": str(item.get("question") or "")[:5000], "options": options[:50]}
        )
    return questions[:20]


def approval_create(*, run: Run, data: dict[str, Any]) -> Approval:
    """Record a pending approval from a ``notify ask`` line's ``data`` (PROTOCOL.md:
    ``{"kind": "confirm", "prompt", "ask_id"}`` or ``{"kind": "ask", "questions",
    "ask_id"}``), with a deadline ``PAW_APPROVAL_TIMEOUT_SECONDS`` from now.

    Call inside a transaction; the caller publishes the request after commit.
    """
    kind = Approval.Kind.CONFIRM if data.get("kind") == "confirm" else Approval.Kind.ASK
    now = timezone.now()
    return Approval.objects.create(
        conversation_id=run.conversation_id,
        run=run,
        kind=kind,
        prompt=str(data.get("prompt") or "")[:20_000] if kind == Approval.Kind.CONFIRM else "",
        questions=_normalize_questions(data) if kind == Approval.Kind.ASK else [],
        ask_id=str(data.get("ask_id") or "")[:200],
        created_at=now,
        expires_at=now + timedelta(seconds=settings.PAW_APPROVAL_TIMEOUT_SECONDS),
    )


def _clean_answers(answers: Any) -> list[str]:
    if (
        not isinstance(answers, list)
        or not answers
        or len(answers) > MAX_ANSWERS
        or not all(isinstance(a, str) and a.strip() for a in answers)
    ):
        raise InvalidRequest(
            f"answers must be a list of 1 to {MAX_ANSWERS} non-empty strings.",
            code="invalid_answers",
        )
    if any(len(a) > MAX_ANSWER_CHARS for a in answers):
        raise InvalidRequest(
            f"An answer is longer than {MAX_ANSWER_CHARS} characters.", code="invalid_answers"
        )
    return [a.strip() for a in answers]


def approval_decide(
    *,
    approval_id: UUID | str,
    user: Any = None,
    approved: bool | None = None,
    answers: list[str] | None = None,
    decided_by: str = "user",
    via: str = "api",
) -> Approval:
    """Decide a pending approval exactly once and send the answer to the runtime.

    A confirm takes ``approved`` (bool); a question takes ``answers`` (1–20 non-empty
    strings; ``approved=False`` declines it). ``user`` (when given) must own the
    conversation. ``decided_by``: ``user`` | ``auto``; ``via``: ``api`` | ``websocket``
    | ``auto``.

    Raises :class:`NotFound` (unknown, or another user's), :class:`InvalidRequest`
    (missing or malformed decision) and :class:`Conflict` with code ``approval_closed``
    (already decided, expired or cancelled; the past deadline counts as expired).
    """
    try:
        approval_uuid = UUID(str(approval_id))
    except ValueError:
        raise NotFound("No such approval.") from None
    with transaction.atomic():
        approval = (
            Approval.objects.select_for_update()
            .select_related("conversation")
            .filter(id=approval_uuid)
            .first()
        )
        if approval is None or (user is not None and approval.conversation.user_id != user.pk):
            raise NotFound("No such approval.")
        if approval.status != Approval.Status.PENDING:
            raise Conflict(
                f"This request was already closed ({approval.status}).", code="approval_closed"
            )
        now = timezone.now()
        if approval.expires_at <= now:
            raise Conflict("This request has expired.", code="approval_closed")
        if approval.kind == Approval.Kind.CONFIRM:
            if not isinstance(approved, bool):
                raise InvalidRequest("Say approved: true or false.", code="invalid_decision")
            approval.status = Approval.Status.APPROVED if approved else Approval.Status.DECLINED
        elif approved is False and answers is None:
            approval.status = Approval.Status.DECLINED
            approval.answers = ["The user declined to answer."]
        else:
            approval.answers = _clean_answers(answers)
            approval.status = Approval.Status.ANSWERED
        approval.decided_by = decided_by
        approval.decided_by_user = user if decided_by == "user" else None
        approval.via = via
        approval.decided_at = now
        approval.save()
        _after_decision(approval, send=decided_by != "auto")
    return approval


def approval_expire(*, approval_id: UUID) -> Approval | None:
    """Close a pending approval whose deadline passed: status ``expired``, decided by
    ``timeout``; the runtime is told "no" (confirm) or "Unanswered" (question). Returns
    ``None`` when it was no longer pending. The caller (the owning node) writes the op."""
    with transaction.atomic():
        approval = Approval.objects.select_for_update().filter(id=approval_id).first()
        if approval is None or approval.status != Approval.Status.PENDING:
            return None
        approval.status = Approval.Status.EXPIRED
        approval.answers = [] if approval.kind == Approval.Kind.CONFIRM else [UNANSWERED]
        approval.decided_by = "timeout"
        approval.via = "timeout"
        approval.decided_at = timezone.now()
        approval.save()
        _after_decision(approval, send=False)
    return approval


def approvals_cancel_for_run(*, run_id: UUID) -> int:
    """Cancel every pending approval of a run that ended; returns how many."""
    count = 0
    with transaction.atomic():
        for approval in Approval.objects.select_for_update().filter(
            run_id=run_id, status=Approval.Status.PENDING
        ):
            approval.status = Approval.Status.CANCELLED
            approval.decided_by = "system"
            approval.via = "run_end"
            approval.decided_at = timezone.now()
            approval.save()
            _after_decision(approval, send=False)
            count += 1
    return count


def _after_decision(approval: Approval, *, send: bool) -> None:
    """After commit: tell every tab, and (``send``) route the answer to the owning node."""
    message = approval_resolved_message(approval)
    conversation_id = approval.conversation_id
    approval_id = approval.id

    def publish() -> None:
        try:
            message_publish(conversation_id=conversation_id, message=message)
        except Exception:
            logger.exception("could not publish the approval decision %s", approval_id)

    transaction.on_commit(publish)
    if send:
        from sandboxes.services import approval_answer_dispatch

        transaction.on_commit(lambda: approval_answer_dispatch(approval_id=approval_id))
