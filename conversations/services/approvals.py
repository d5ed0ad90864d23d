"""Approvals: the agent's questions (``ask``) and requests to confirm a risky action.

An approval is created when the runtime sends ``notify ask`` and is decided exactly once:
by a person (websocket or API, whichever comes first: the row lock decides), by the
conversation's auto-approve toggle (confirms only), or by its deadline (a confirm is
declined, a question answered "Unanswered"). The decision becomes an ``answer`` op to
the runtime, written by the node that owns the sandbox.
"""

from __future__ import annotations

import json
import logging
from datetime import timedelta
from typing import Any
from uuid import UUID

from django.db import transaction
from django.utils import timezone

from conversations.models import Approval, Run
from conversations.selectors.conversations import approval_timeout_of
from conversations.selectors.messages import approval_request_message, approval_resolved_message
from conversations.selectors.runs import UNANSWERED
from conversations.services.events import message_publish_on_commit
from conversations.services.live_status import conversation_changed_publish
from paw_project import metrics
from paw_project.errors import Conflict, InvalidRequest, NotFound
from sandboxes.enqueue import approval_answer_enqueue

logger = logging.getLogger(__name__)

MAX_ANSWERS = 20
MAX_ANSWER_CHARS = 10_000


def approval_request_publish(approval: Approval) -> None:
    """Ask every tab of the conversation (``agent_confirm_request``), after commit; the
    owner's sidebar shows it waiting (``live_status``)."""
    message_publish_on_commit(
        conversation_id=approval.conversation_id, message=approval_request_message(approval)
    )
    conversation_changed_publish(conversation_id=approval.conversation_id)


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


#: Most characters of JSON a confirm's ``call`` may take; a larger one is not kept (its
#: approval then allows no gated call).
MAX_CALL_CHARS = 200_000


def confirm_call(data: dict[str, Any]) -> dict[str, Any] | None:
    """The tool call a confirm's ``data`` names (paw-agent's ``call``: ``{"name": str,
    "args": {...}, "input": {...}}``, the item its ``tool_calls`` line will carry), or
    ``None`` when it names none, or not as a JSON object with a string ``name`` (within
    ``MAX_CALL_CHARS``). The runtime is untrusted: the call is kept as given and only ever
    compared with the calls it announces (``run_effects``)."""
    call = data.get("call")
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return None
    try:
        size = len(json.dumps(call, ensure_ascii=False))
    except (TypeError, ValueError):
        return None
    return call if size <= MAX_CALL_CHARS else None


def tool_name_key(name: Any) -> str:
    """A tool's name as PAW compares it with ``PAW_APPROVAL_REQUIRED_TOOLS``: without
    surrounding space, case-folded (``"Bash "`` and ``"bash"`` are one tool); ``""`` for
    anything but a string."""
    return name.strip().casefold() if isinstance(name, str) else ""


def call_key(call: Any) -> str | None:
    """What identifies a tool call for its approval: the tool (:func:`tool_name_key`) and
    every other field of the call exactly as the runtime wrote it (paw-agent: ``args``
    and ``input``), as canonical JSON; ``None`` for anything but an object. A
    ``tool_calls`` item is allowed by an approved confirm whose ``call`` has the same
    key."""
    if not isinstance(call, dict):
        return None
    fields = {key: value for key, value in call.items() if key != "name"}
    try:
        rest = json.dumps(fields, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError):
        return None
    return f"{tool_name_key(call.get('name'))}\n{rest}"


def approvals_use(*, run_id: UUID, keys: list[str | None]) -> list[int]:
    """Let gated calls of a run use its approvals: for each call's :func:`call_key` (in
    order), the oldest approved confirm of the run whose ``call`` has that key and that
    no call used yet is marked used (``used_at``), so each approval allows one call,
    once. Returns the indexes of the ``keys`` no approval allowed (``None`` keys never
    match). Call inside a transaction (the approvals are locked)."""
    available: dict[str, list[Approval]] = {}
    for approval in (
        Approval.objects.select_for_update()
        .filter(
            run_id=run_id,
            kind=Approval.Kind.CONFIRM,
            status=Approval.Status.APPROVED,
            used_at__isnull=True,
            call__isnull=False,
        )
        .order_by("created_at")
    ):
        key = call_key(approval.call)
        if key is not None:
            available.setdefault(key, []).append(approval)
    unmatched, now = [], timezone.now()
    for index, key in enumerate(keys):
        candidates = available.get(key) if key is not None else None
        if not candidates:
            unmatched.append(index)
            continue
        approval = candidates.pop(0)
        approval.used_at = now
        approval.save(update_fields=["used_at"])
    return unmatched


def approval_create(*, run: Run, data: dict[str, Any]) -> Approval:
    """Record a pending approval from a ``notify ask`` line's ``data`` (PROTOCOL.md:
    ``{"kind": "confirm", "prompt", "ask_id"}``, with paw-agent the ``call`` it is for
    (:func:`confirm_call`), or ``{"kind": "ask", "questions", "ask_id"}``), with a deadline
    from now: the conversation's ``approval_timeout_seconds``, else
    ``PAW_APPROVAL_TIMEOUT_SECONDS``.

    Call inside a transaction; the caller publishes the request after commit.
    """
    kind = Approval.Kind.CONFIRM if data.get("kind") == "confirm" else Approval.Kind.ASK
    now = timezone.now()
    approval = Approval.objects.create(
        conversation_id=run.conversation_id,
        run=run,
        kind=kind,
        prompt=str(data.get("prompt") or "")[:20_000] if kind == Approval.Kind.CONFIRM else "",
        questions=_normalize_questions(data) if kind == Approval.Kind.ASK else [],
        ask_id=str(data.get("ask_id") or "")[:200],
        call=confirm_call(data) if kind == Approval.Kind.CONFIRM else None,
        created_at=now,
        expires_at=now + timedelta(seconds=approval_timeout_of(run.conversation)),
    )
    transaction.on_commit(lambda: metrics.approval_raised(kind=kind))
    return approval


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
        # Only the approval's row is locked: the event pipeline locks a conversation before
        # its approvals (a gated call using one, a run's end cancelling them), so locking
        # the conversation here too could deadlock with it.
        approval = (
            Approval.objects.select_for_update(of=("self",))
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
    """After commit: tell every tab, and (``send``) route the answer to the node running
    the run."""
    decided_by, status = approval.decided_by, approval.status
    transaction.on_commit(lambda: metrics.approval_decided(decided_by=decided_by, status=status))
    message_publish_on_commit(
        conversation_id=approval.conversation_id, message=approval_resolved_message(approval)
    )
    conversation_changed_publish(conversation_id=approval.conversation_id)
    if send:
        node = Run.objects.filter(id=approval.run_id).values_list("node", flat=True).first()
        if node:
            approval_id = approval.id
            transaction.on_commit(
                lambda: approval_answer_enqueue(approval_id=approval_id, node=node)
            )
