"""Reads of runs and approvals: for people, always scoped to the requesting user; for the
worker nodes and the reaper, by id (the last section)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db.models import QuerySet, Sum
from django.db.models.fields.json import KT
from django.db.models.functions import Length

from conversations.models import Approval, Conversation, Run, RunEvent
from conversations.selectors.conversations import conversation_get
from paw_project.errors import NotFound


def run_list(*, user: Any, conversation_id: UUID | str) -> QuerySet[Run]:
    """The conversation's runs, newest first. Raises ``NotFound`` for another user's one."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    return Run.objects.filter(conversation=conversation).order_by("-created_at", "-id")


def run_get(*, user: Any, conversation_id: UUID | str, run_id: UUID | str) -> Run:
    """One run of the user's conversation, or ``NotFound``."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    run = Run.objects.filter(conversation=conversation, id=run_id).first()
    if run is None:
        raise NotFound("No such run.")
    return run


@dataclass(frozen=True)
class RunVersions:
    """Where a run stands among the versions of its turn: ``version`` (1 for the first),
    ``versions`` (the ids of every version of the turn, oldest first), ``replaced_by``
    (the id of the next version, or ``None`` for the newest)."""

    version: int
    versions: list[UUID]
    replaced_by: UUID | None


def run_versions(
    *, conversation_id: UUID, runs: QuerySet[Run] | None = None
) -> dict[UUID, RunVersions]:
    """The versions of every run of the conversation (one query of ids): run id →
    :class:`RunVersions`. A run that replaces none and is replaced by none is version 1
    of 1. ``runs``: only these runs of it count (a share's snapshot: a later version
    outside them is not named)."""
    rows = runs if runs is not None else Run.objects.filter(conversation_id=conversation_id)
    replaces_of = dict(rows.values_list("id", "replaces_id"))
    next_of = {earlier: later for later, earlier in replaces_of.items() if earlier is not None}
    out: dict[UUID, RunVersions] = {}
    for run_id, earlier in replaces_of.items():
        if earlier is not None and earlier in replaces_of:
            continue  # not the first version: done from its first one
        chain = [run_id]
        while chain[-1] in next_of:
            chain.append(next_of[chain[-1]])
        for index, member in enumerate(chain):
            out[member] = RunVersions(
                version=index + 1,
                versions=chain,
                replaced_by=chain[index + 1] if index + 1 < len(chain) else None,
            )
    return out


def run_last(*, conversation_id: UUID) -> Run | None:
    """The conversation's newest run (the last turn's newest version), or ``None``."""
    return (
        Run.objects.filter(conversation_id=conversation_id).order_by("-created_at", "-id").first()
    )


def approval_list(
    *, user: Any, conversation_id: UUID | str, status: str | None = None
) -> QuerySet[Approval]:
    """The conversation's approvals (optionally only those with ``status``), oldest first.
    Raises ``NotFound`` for another user's conversation."""
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    approvals = Approval.objects.filter(conversation=conversation).order_by("created_at", "id")
    return approvals.filter(status=status) if status else approvals


# --- reads for the worker nodes and the reaper (not scoped to a user: never call them
# with ids a person sent) ----------------------------------------------------------------


def run_for_node(*, run_id: UUID) -> Run | None:
    """The run ``run_id``, or ``None``."""
    return Run.objects.filter(id=run_id).first()


def run_cancel_requested(*, run_id: UUID) -> bool:
    """Whether somebody asked for the run to stop (``Run.cancel_requested``)."""
    return Run.objects.filter(id=run_id, cancel_requested=True).exists()


def run_ids_active_on_nodes(*, nodes: list[str]) -> list[UUID]:
    """The ids of the runs claimed by one of ``nodes`` that have not finished."""
    return list(
        Run.objects.filter(node__in=nodes, status__in=Run.ACTIVE_STATUSES).values_list(
            "id", flat=True
        )
    )


def runs_queued_before(*, cutoff: datetime) -> list[tuple[UUID, UUID]]:
    """``(run id, conversation id)`` of the runs still ``queued`` that were created at or
    before ``cutoff``."""
    return list(
        Run.objects.filter(status=Run.Status.QUEUED, created_at__lte=cutoff).values_list(
            "id", "conversation_id"
        )
    )


def waiting_counts() -> dict[str, int]:
    """What waits now, across every node: ``{"runs_queued": int, "approvals_pending":
    int}`` (two indexed counts; read at each metrics scrape)."""
    return {
        "runs_queued": Run.objects.filter(status=Run.Status.QUEUED).count(),
        "approvals_pending": Approval.objects.filter(status=Approval.Status.PENDING).count(),
    }


#: What an expired question is answered with (the model is told nobody answered).
UNANSWERED = "Unanswered"


@dataclass(frozen=True)
class AnswerOp:
    """The ``answer`` op (PROTOCOL.md) that carries a decided approval to its run's
    sandbox: ``answers`` and ``ask_id`` are the op's fields, ``conversation_id`` and
    ``run_id`` where it goes. ``approved_call``: the tool call an approved confirm allows
    (``{"name", "args", "input"}`` as the runtime named it; ``None`` for anything else),
    which the node opens the package index for when it is an ``install_package``."""

    conversation_id: UUID
    run_id: UUID
    answers: list[str]
    ask_id: str | None
    approved_call: dict[str, Any] | None = None


def approval_answers(approval: Approval) -> list[str]:
    """The ``answers`` of the ``answer`` op that carries a decided approval to the runtime
    (a confirm: ``["yes"]`` or ``["no"]``, PROTOCOL.md)."""
    if approval.kind == Approval.Kind.CONFIRM:
        return ["yes" if approval.status == Approval.Status.APPROVED else "no"]
    return list(approval.answers) or [UNANSWERED]


def approval_answer_op(approval: Approval) -> AnswerOp:
    """The ``answer`` op of the decided ``approval``."""
    approved = (
        approval.kind == Approval.Kind.CONFIRM and approval.status == Approval.Status.APPROVED
    )
    call = approval.call if approved and isinstance(approval.call, dict) else None
    return AnswerOp(
        conversation_id=approval.conversation_id,
        run_id=approval.run_id,
        answers=approval_answers(approval),
        ask_id=approval.ask_id or None,
        approved_call=call,
    )


def approval_answer_op_for_node(*, approval_id: UUID) -> AnswerOp | None:
    """The ``answer`` op of the approval ``approval_id``; ``None`` when there is no such
    approval or it is still pending."""
    approval = Approval.objects.filter(id=approval_id).first()
    if approval is None or approval.status == Approval.Status.PENDING:
        return None
    return approval_answer_op(approval)


def approval_ids_due(*, node: str, now: datetime, limit: int = 100) -> list[UUID]:
    """Up to ``limit`` pending approvals of runs on ``node`` whose deadline is past."""
    return list(
        Approval.objects.filter(
            status=Approval.Status.PENDING, expires_at__lte=now, run__node=node
        ).values_list("id", flat=True)[:limit]
    )


def conversation_exists(*, conversation_id: UUID) -> bool:
    """Whether the conversation still exists (it may be deleted while its sandbox runs)."""
    return Conversation.objects.filter(id=conversation_id).exists()


def conversation_turns(
    *, conversation_id: UUID, limit: int, exclude_run: UUID | None = None
) -> list[dict[str, str]]:
    """The conversation's last ``limit`` finished turns since its memory was last reset,
    oldest first: ``[{"prompt": str, "answer": str}]`` (what a new sandbox is seeded
    with). A run another one replaced (an edited or regenerated turn) is not among them."""
    conversation = Conversation.objects.only("memory_since").get(id=conversation_id)
    runs = Run.objects.filter(
        conversation_id=conversation_id, status=Run.Status.DONE, replaced_by__isnull=True
    ).exclude(answer="")
    if exclude_run is not None:
        runs = runs.exclude(id=exclude_run)
    if conversation.memory_since is not None:
        runs = runs.filter(created_at__gte=conversation.memory_since)
    turns = list(runs.order_by("-created_at").values("prompt", "answer")[:limit])
    return [{"prompt": t["prompt"], "answer": t["answer"]} for t in reversed(turns)]


def run_model_traffic(*, run: Run) -> tuple[int, int]:
    """What PAW knows a run exchanged with the model, in characters: ``(sent, streamed)``.
    ``sent``: its prompt and the earlier turns of its conversation the runtime holds in
    its memory (the last ``PAW_HISTORY_TURNS // 2`` exchanges since the memory was reset,
    as the sandbox is seeded: ``sandboxes.launch.memory_exchanges``); ``streamed``: the text
    of its stored ``delta`` events. What a run that reported no usage is billed on
    (``runs.run_finish``)."""
    turns = conversation_turns(
        conversation_id=run.conversation_id,
        limit=settings.PAW_HISTORY_TURNS // 2,
        exclude_run=run.id,
    )
    sent = len(run.prompt) + sum(len(t["prompt"]) + len(t["answer"]) for t in turns)
    streamed = RunEvent.objects.filter(run_id=run.id, type="delta").aggregate(
        chars=Sum(Length(KT("payload__text")))
    )["chars"]
    return sent, streamed or 0
