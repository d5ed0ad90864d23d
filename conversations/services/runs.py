"""Runs: start, cancel, and every state change until the run is finished.

A run goes ``queued`` → ``starting`` (a worker claimed it) → ``running`` (the runtime
acknowledged the submit with ``start``) → ``done`` | ``error`` | ``cancelled``. Each
change is written under the run's row lock and published as ``run.status`` after commit;
a finished run never changes again, so a finish that is retried (or raced by the reaper)
is a no-op and usage is billed exactly once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.services import budget_check_start, usage_normalize, usage_record
from conversations.models import Conversation, Run, RunEvent
from conversations.services.approvals import approvals_cancel_for_run
from conversations.services.events import run_status_publish
from paw_project.errors import Conflict, InvalidRequest, NotFound

logger = logging.getLogger(__name__)

#: Longest prompt accepted (characters).
MAX_PROMPT_CHARS = 100_000
#: Longest title taken from a conversation's first prompt (characters).
AUTO_TITLE_CHARS = 60


def title_from_prompt(prompt: str) -> str:
    """A conversation title from a prompt: its first line, cut at a word boundary to at
    most ``AUTO_TITLE_CHARS`` characters (with an ellipsis when cut)."""
    line = next((part.strip() for part in prompt.splitlines() if part.strip()), "")
    if len(line) <= AUTO_TITLE_CHARS:
        return line
    cut = line[: AUTO_TITLE_CHARS - 1].rsplit(" ", 1)[0] or line[: AUTO_TITLE_CHARS - 1]
    return cut.rstrip(" ,.;:") + "…"


def error_entry(code: str, message: str) -> dict[str, str]:
    """One item of ``Run.errors``: ``{"code": str, "message": str}``."""
    return {"code": code, "message": message}


def conversation_for_user(*, user: Any, conversation_id: UUID | str) -> Conversation:
    """The user's conversation, or :class:`NotFound` (also for another user's one and for
    a malformed id)."""
    try:
        return Conversation.objects.get(id=UUID(str(conversation_id)), user=user)
    except (ValueError, Conversation.DoesNotExist):
        raise NotFound("No such conversation.") from None


def run_start(
    *,
    user: Any,
    conversation_id: UUID | str,
    prompt: str,
    llm_provider: str | None = None,
    llm_model: str | None = None,
    datasources: Sequence[str] | None = None,
) -> Run:
    """Create a ``queued`` run and hand it to a worker once committed.

    ``prompt``: 1–100,000 characters. ``llm_provider``/``llm_model`` override the
    conversation's default; ``datasources`` are slugs the run may query.

    An untitled conversation takes its title from the prompt (:func:`title_from_prompt`).

    Raises :class:`NotFound` (not the user's conversation), :class:`InvalidRequest`
    (empty prompt, unknown provider/model/datasource, no active provider),
    :class:`BudgetExhausted` (402: the monthly token budget is used up) and
    :class:`Conflict` with code ``run_active`` (409: another run of the conversation is
    queued or running; a partial unique constraint makes this hold under races).
    """
    from sandboxes.services import run_enqueue, run_plan

    conversation = conversation_for_user(user=user, conversation_id=conversation_id)
    prompt = (prompt or "").strip()
    if not prompt:
        raise InvalidRequest("The prompt is empty.", code="empty_prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidRequest(
            f"The prompt is longer than {MAX_PROMPT_CHARS} characters.", code="prompt_too_long"
        )
    budget_check_start(user_id=user.pk)
    plan = run_plan(
        user=user,
        conversation=conversation,
        llm_provider=llm_provider,
        llm_model=llm_model,
        datasources=list(datasources or []),
    )
    try:
        with transaction.atomic():
            run = Run.objects.create(
                conversation=conversation,
                user=user,
                prompt=prompt,
                provider=plan.provider,
                model=plan.model,
                datasources=plan.datasources,
            )
            Conversation.objects.filter(id=conversation.id).update(last_activity_at=run.created_at)
            # An untitled conversation is named after its first prompt (the sidebar's label).
            Conversation.objects.filter(id=conversation.id, title="").update(
                title=title_from_prompt(prompt)
            )
            # Hand the run to a worker first, then tell the tabs: the run's start waits on
            # the first, nobody waits on the second.
            transaction.on_commit(lambda: run_enqueue(run_id=run.id))
            run_status_publish(run)
    except IntegrityError:
        if Run.objects.filter(conversation=conversation, status__in=Run.ACTIVE_STATUSES).exists():
            raise Conflict(
                "Another run of this conversation is still active; wait for it or cancel it.",
                code="run_active",
            ) from None
        raise
    return run


def run_cancel(*, user: Any, conversation_id: UUID | str, run_id: UUID | str) -> Run:
    """Ask for a run to stop. A queued run is cancelled at once; a starting or running
    one gets a ``cancel`` op through its sandbox's node and ends when the runtime's
    cancelled ``result`` arrives (or is force-ended by the monitor).

    Raises :class:`NotFound` (not the user's run) and :class:`Conflict` with code
    ``run_finished`` when the run has already finished.
    """
    from sandboxes.services import run_cancel_dispatch

    conversation = conversation_for_user(user=user, conversation_id=conversation_id)
    try:
        run_uuid = UUID(str(run_id))
    except ValueError:
        raise NotFound("No such run.") from None
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(id=run_uuid, conversation=conversation).first()
        if run is None:
            raise NotFound("No such run.")
        if not run.is_active:
            raise Conflict(f"The run has already finished ({run.status}).", code="run_finished")
        run.cancel_requested = True
        if run.status == Run.Status.QUEUED:
            _finish(run, status=Run.Status.CANCELLED, errors=[])
        else:
            run.save(update_fields=["cancel_requested"])
            transaction.on_commit(lambda: run_cancel_dispatch(run_id=run.id))
    return run


def run_claim(*, run_id: UUID, node: str) -> Run | None:
    """Move a ``queued`` run to ``starting`` on ``node`` (returned with its user and
    conversation); ``None`` when it is no longer queued (already claimed, cancelled, or
    gone): the caller then does nothing."""
    with transaction.atomic():
        run = (
            Run.objects.select_for_update(of=("self",))
            .select_related("user", "conversation")
            .filter(id=run_id)
            .first()
        )
        if run is None or run.status != Run.Status.QUEUED:
            return None
        run.status = Run.Status.STARTING
        run.node = node
        run.save(update_fields=["status", "node"])
        run_status_publish(run)
    return run


def run_mark_running(*, run_id: UUID) -> Run | None:
    """``starting`` → ``running`` (the runtime's ``start`` line arrived). Idempotent."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(id=run_id).first()
        if run is None or run.status not in (Run.Status.QUEUED, Run.Status.STARTING):
            return run
        run.status = Run.Status.RUNNING
        run.started_at = timezone.now()
        run.save(update_fields=["status", "started_at"])
        run_status_publish(run)
    return run


def run_finish(
    *,
    run_id: UUID,
    status: str,
    answer: str = "",
    errors: Sequence[dict[str, str]] = (),
    model: str = "",
    usage: dict[str, Any] | None = None,
) -> Run | None:
    """End a run (``done``, ``error`` or ``cancelled``) with its outcome and usage, and
    bill it (one ledger row, ``billing.services.usage_record``, in the same transaction).

    ``usage``: ``{"input", "output", "rounds", "estimated"}`` (tokens, tokens, model
    calls). Without it (the run ended without a ``result``: the sandbox died, the worker
    was lost) the run is billed for the last running totals it reported (its latest
    stored ``notify usage`` event), or zero.

    A run already finished is left as it is (returns it unchanged): the first finish
    wins, which makes retries and races with the reaper harmless and bills a run exactly
    once. Returns ``None`` when the run does not exist.
    """
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(id=run_id).first()
        if run is None or not run.is_active:
            return run
        if model:
            run.model = model[:200]
        run.answer = answer
        run.usage = usage_normalize(usage if usage is not None else _reported_usage(run.id))
        _finish(run, status=status, errors=list(errors))
    return run


def _reported_usage(run_id: UUID) -> dict[str, Any] | None:
    """The running totals of the run's latest stored ``notify usage`` line, if any."""
    event = (
        RunEvent.objects.filter(run_id=run_id, type="notify", kind="usage")
        .order_by("-cursor")
        .values_list("payload", flat=True)
        .first()
    )
    return event.get("data") if isinstance(event, dict) else None


def run_fail(*, run_id: UUID, code: str, message: str) -> Run | None:
    """End an active run with ``error`` and one error ``{"code", "message"}``."""
    return run_finish(run_id=run_id, status=Run.Status.ERROR, errors=[error_entry(code, message)])


def _finish(run: Run, *, status: str, errors: list[dict[str, str]]) -> None:
    """Write the final state of a locked, active run, bill it, and publish it after
    commit. The one place a run ends: every finished run has exactly one ledger row."""
    if status not in Run.FINISHED_STATUSES:
        raise ValueError(f"{status!r} is not a finished status")
    run.status = status
    run.errors = errors
    run.finished_at = timezone.now()
    run.usage = usage_normalize(run.usage)
    run.save()
    usage_record(run=run)
    # A question nobody can answer any more is closed with the run.
    approvals_cancel_for_run(run_id=run.id)
    run_status_publish(run)
