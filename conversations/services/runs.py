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
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.services import budget_check_start, usage_estimate, usage_normalize, usage_record
from conversations.models import Conversation, Run, RunEvent
from conversations.selectors import runs as run_selectors
from conversations.selectors.conversations import conversation_get
from conversations.selectors.messages import run_status_message
from conversations.services.approvals import approvals_cancel_for_run
from conversations.services.attachments import attachments_validate, attachments_vision_check
from conversations.services.conversations import conversation_create
from conversations.services.events import (
    message_publish_on_commit,
    notice_append,
    run_status_publish,
)
from conversations.services.lineage import run_result_with_lineage
from paw_project import metrics
from paw_project.errors import Conflict, InvalidRequest, NotFound
from sandboxes.enqueue import run_cancel_enqueue, run_execute_enqueue
from secrets_vault.masking import mask_text
from secrets_vault.services import (
    datasources_kept,
    datasources_validate,
    prompt_secret_values,
    provider_resolve,
)

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


@dataclass(frozen=True)
class RunPlan:
    """The validated choices a run is created with: provider name, model name, the
    slugs of the datasources it may query, whether the model accepts images, and the
    secret values its prompt is masked with (``NAME → value``,
    ``secrets_vault.services.prompt_secret_values``)."""

    provider: str
    model: str
    datasources: list[str]
    vision: bool = False
    secret_values: dict[str, str] = field(default_factory=dict, repr=False)


def run_plan(
    *, user: Any, conversation: Conversation, llm_provider: str | None, llm_model: str | None,
    datasources: list[str],
) -> RunPlan:  # fmt: skip
    """Validate a run's provider, model and datasources before it is created (provider
    precedence and activation: ``secrets_vault.services.provider_resolve``).

    Raises :class:`InvalidRequest` with the reason: ``no_provider``, ``unknown_provider``,
    ``provider_inactive``, ``unknown_model``, ``unknown_datasource``.
    """
    choice = provider_resolve(
        user=user, conversation=conversation, llm_provider=llm_provider, llm_model=llm_model
    )
    slugs = datasources_validate(slugs=datasources, user=user)
    return RunPlan(
        provider=choice.name,
        model=choice.model,
        datasources=slugs,
        vision=choice.vision,
        secret_values=prompt_secret_values(user=user, provider=choice),
    )


#: The tools of a run started by ``POST /api/sql/ask`` (:func:`sql_ask`).
SQL_TOOLS = ("run_sql", "search_knowledge", "ask_user")


def run_start(
    *,
    user: Any,
    conversation_id: UUID | str,
    prompt: str,
    llm_provider: str | None = None,
    llm_model: str | None = None,
    datasources: Sequence[str] | None = None,
    kind: str = Run.Kind.CHAT,
    tools: Sequence[str] = (),
    replaces: Run | None = None,
    attachments: Sequence[str] = (),
) -> Run:
    """Create a ``queued`` run and hand it to a worker once committed.

    ``prompt``: 1–100,000 characters. ``llm_provider``/``llm_model`` override the
    conversation's default; ``datasources`` are slugs the run may query (None: the
    conversation's ``datasources``, less any disabled since and any ``user`` may no
    longer use, which the run says in a ``notice`` ``datasource_access_lost``; ``[]``:
    none); ``tools``, when
    given, the only tools it may use (``kind`` ``sql``: :func:`sql_ask`); ``replaces``, the
    run it is a new version of (:func:`run_replace` checks that it may be);
    ``attachments``, images of the workspace sent to the model with the prompt
    (``conversations.services.attachments``: PNG, JPEG or WebP, each at most
    ``PAW_MAX_IMAGE_BYTES``, for a model that accepts images).

    An untitled conversation takes its title from the prompt (:func:`title_from_prompt`).
    The prompt is stored masked, as the run's events are: each of the user's secrets and
    the provider's key typed into it, in any form masking covers, is ``[secret:NAME]``
    (:class:`RunPlan`), in the run, the history, the title and what the agent is sent
    (its value is in the sandbox's environment as ``NAME``).

    Raises :class:`NotFound` (not the user's conversation), :class:`InvalidRequest`
    (empty prompt, unknown provider/model/datasource, no active provider; attachments:
    ``attachment_not_found``, ``attachment_not_image``, ``attachment_too_large``,
    ``too_many_attachments``, ``model_without_vision``),
    :class:`BudgetExhausted` (402: the monthly token budget is used up; never for the
    offline demo's provider) and
    :class:`Conflict` with code ``run_active`` (409: another run of the conversation is
    queued or running; a partial unique constraint makes this hold under races).
    """
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    prompt = (prompt or "").strip()
    if not prompt:
        raise InvalidRequest("The prompt is empty.", code="empty_prompt")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise InvalidRequest(
            f"The prompt is longer than {MAX_PROMPT_CHARS} characters.", code="prompt_too_long"
        )
    images = attachments_validate(conversation_id=conversation.id, attachments=attachments)
    # The conversation's kept datasources are checked again at every run: one the person
    # may no longer use (a team left, an access rule changed) is left out, and said so.
    kept = (
        datasources_kept(slugs=list(conversation.datasources or []), user=user)
        if datasources is None
        else None
    )
    plan = run_plan(
        user=user,
        conversation=conversation,
        llm_provider=llm_provider,
        llm_model=llm_model,
        datasources=list(datasources) if kept is None else kept.usable,
    )
    attachments_vision_check(
        attachments=images, vision=plan.vision, provider=plan.provider, model=plan.model
    )
    # Masked at write, like the events: nothing stored holds the value.
    prompt = mask_text(prompt, plan.secret_values)
    # After the plan: a run of the offline demo is never refused for a budget.
    budget_check_start(user_id=user.pk, provider=plan.provider)
    try:
        with transaction.atomic():
            run = Run.objects.create(
                conversation=conversation,
                user=user,
                prompt=prompt,
                provider=plan.provider,
                model=plan.model,
                datasources=plan.datasources,
                kind=kind,
                tools=list(tools),
                replaces=replaces,
                attachments=images,
            )
            Conversation.objects.filter(id=conversation.id).update(last_activity_at=run.created_at)
            # An untitled conversation is named after its first prompt (the sidebar's label).
            Conversation.objects.filter(id=conversation.id, title="").update(
                title=title_from_prompt(prompt)
            )
            # Hand the run to a worker first, then tell the tabs: the run's start waits on
            # the first, nobody waits on the second.
            transaction.on_commit(
                lambda: run_execute_enqueue(run_id=run.id, conversation_id=conversation.id)
            )
            if kept is not None and kept.lost:
                _datasources_lost_notice(run, kept.lost)
            run_status_publish(run)
            transaction.on_commit(metrics.run_started)
    except IntegrityError:
        if Run.objects.filter(conversation=conversation, status__in=Run.ACTIVE_STATUSES).exists():
            raise Conflict(
                "Another run of this conversation is still active; wait for it or cancel it.",
                code="run_active",
            ) from None
        if replaces is not None and Run.objects.filter(replaces=replaces).exists():
            raise _not_last_turn() from None  # another new version came first
        raise
    return run


#: The notice of a run left without some of its conversation's datasources.
DATASOURCES_LOST_CODE = "datasource_access_lost"


def _datasources_lost_notice(run: Run, slugs: list[str]) -> None:
    """Store (with the run, in its transaction) the notice that the conversation's
    datasources ``slugs`` are left out of ``run``: its person may no longer use them."""
    names = ", ".join(slugs)
    notice_append(
        conversation_id=run.conversation_id,
        run_id=run.id,
        code=DATASOURCES_LOST_CODE,
        message=(
            f"This run goes without {names}: you may no longer use "
            f"{'it' if len(slugs) == 1 else 'them'} (your teams or the datasource's access "
            "changed). Ask an operator if you need it."
        ),
    )


def _not_last_turn() -> Conflict:
    return Conflict(
        "Only the last turn of a conversation can be edited or regenerated.",
        code="not_last_turn",
    )


def run_replace(
    *,
    user: Any,
    conversation_id: UUID | str,
    run_id: UUID | str,
    prompt: str | None = None,
    llm_provider: str | None = None,
    llm_model: str | None = None,
    datasources: Sequence[str] | None = None,
    attachments: Sequence[str] | None = None,
) -> Run:
    """Answer the conversation's last turn anew: a new ``queued`` run that replaces it,
    with ``prompt`` (an edited prompt) or, without one, the prompt of ``run_id`` again (a
    regenerated answer). ``run_id`` is any version of the last turn (the one the person
    looks at); the new run replaces the turn's newest version and becomes the next
    version (``Run.replaces``). The replaced runs stay stored with their events and
    artifacts, and are left out of the agent's memory: the node re-seeds the sandbox
    without them before the new run (``sandboxes.services.run_execute``). The new run
    keeps the turn's ``kind`` and ``tools`` (an SQL question stays one) and, when
    ``datasources`` is None, a chat run takes the conversation's datasources as any new
    prompt does, an SQL question its own. ``attachments`` None: the images ``run_id`` was
    sent with go again (checked again: a file removed since is refused).

    Raises :class:`NotFound` (not the user's conversation, or no such run in it),
    :class:`Conflict` ``run_active`` (409: a run of the conversation is active; wait for
    it or cancel it) or ``not_last_turn`` (409: the run is not a version of the last
    turn), and what :func:`run_start` raises (400 ``empty_prompt``, ``prompt_too_long``,
    a provider or datasource refused, 402 ``budget_exhausted``).
    """
    try:
        run_uuid = UUID(str(run_id))
    except ValueError:
        raise NotFound("No such run.") from None
    with transaction.atomic():
        # The conversation's row lock orders two edits of one turn sent at once.
        conversation = conversation_get(user=user, conversation_id=conversation_id, for_update=True)
        target = Run.objects.filter(id=run_uuid, conversation=conversation).first()
        if target is None:
            raise NotFound("No such run.")
        if Run.objects.filter(conversation=conversation, status__in=Run.ACTIVE_STATUSES).exists():
            raise Conflict(
                "A run of this conversation is still active; wait for it or cancel it.",
                code="run_active",
            )
        versions = run_selectors.run_versions(conversation_id=conversation.id)[target.id]
        newest = versions.versions[-1]
        last = run_selectors.run_last(conversation_id=conversation.id)
        if last is None or last.id != newest:
            raise _not_last_turn()
        if datasources is None and target.kind == Run.Kind.SQL:
            datasources = list(target.datasources)
        return run_start(
            user=user,
            conversation_id=conversation.id,
            prompt=target.prompt if prompt is None else prompt,
            llm_provider=llm_provider,
            llm_model=llm_model,
            datasources=datasources,
            kind=target.kind,
            tools=target.tools,
            replaces=last,
            attachments=list(target.attachments) if attachments is None else attachments,
        )


def sql_ask(
    *,
    user: Any,
    datasource: str,
    question: str,
    conversation_id: UUID | str | None = None,
    llm_provider: str | None = None,
    llm_model: str | None = None,
) -> Run:
    """A question about one datasource, answered with SQL (``POST /api/sql/ask``): a run
    of kind ``sql`` restricted to :data:`SQL_TOOLS` (paw-agent offers no other, and PAW
    stops it at any other call), on ``datasource``, in the user's conversation
    ``conversation_id`` or a new one (titled after the question, its ``datasources``
    ``[datasource]`` so that later chat runs in it have the database). The finished run's
    ``result`` holds its last query's rows (``run_effects``). Writing SQL still waits for
    an approval.

    Raises what :func:`run_start` raises (``unknown_datasource`` for an unknown or
    disabled slug, 404 for another user's conversation, 409, 402 …); a refused question
    leaves no new conversation behind.
    """
    slugs = datasources_validate(slugs=[datasource], user=user)
    with transaction.atomic():
        if conversation_id is None:
            # The new conversation keeps the datasource: a follow-up asked in the chat
            # (which names none) still works on it.
            conversation_id = conversation_create(user=user, datasources=slugs).id
        return run_start(
            user=user,
            conversation_id=conversation_id,
            prompt=question,
            llm_provider=llm_provider,
            llm_model=llm_model,
            datasources=slugs,
            kind=Run.Kind.SQL,
            tools=SQL_TOOLS,
        )


def run_result_record(*, run_id: UUID, result: dict[str, Any]) -> None:
    """Keep ``result`` (see ``run_effects.sql_result_of``) as the run's ``result``, while
    the run is active (a finished run never changes)."""
    Run.objects.filter(id=run_id, status__in=Run.ACTIVE_STATUSES).update(result=result)


def run_cancel(*, user: Any, conversation_id: UUID | str, run_id: UUID | str) -> Run:
    """Ask for a run to stop. A queued run is cancelled at once; a starting or running
    one gets a ``cancel`` op through its sandbox's node and ends when the runtime's
    cancelled ``result`` arrives (or is force-ended by the monitor).

    Raises :class:`NotFound` (not the user's run) and :class:`Conflict` with code
    ``run_finished`` when the run has already finished.
    """
    conversation = conversation_get(user=user, conversation_id=conversation_id)
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
            if run.node:
                transaction.on_commit(lambda: run_cancel_enqueue(run_id=run.id, node=run.node))
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
        _status_only_publish(run)
    return run


def _status_only_publish(run: Run) -> None:
    """Publish ``run.status`` (after commit) for a run that moved between active statuses
    (``queued`` → ``starting`` → ``running``): the conversation's sidebar state is the
    same (active, the same run, its approvals), so it is not sent again. Both moves lie
    on the way to the run's first token (the node's claim before its submit, the
    pipeline's ``start`` line before the first delta): the state's three queries and its
    message cost a third of that work (issue 16, py-spy)."""
    message_publish_on_commit(conversation_id=run.conversation_id, message=run_status_message(run))


def run_mark_running(*, run_id: UUID, runtime_gated: bool | None = None) -> Run | None:
    """``starting`` → ``running`` (the runtime's ``start`` line arrived), recording
    ``runtime_gated``: whether that runtime asks before its risky tools act (``None``:
    not known). Idempotent."""
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(id=run_id).first()
        if run is None or run.status not in (Run.Status.QUEUED, Run.Status.STARTING):
            return run
        run.status = Run.Status.RUNNING
        run.started_at = timezone.now()
        run.runtime_gated = runtime_gated
        run.save(update_fields=["status", "started_at", "runtime_gated"])
        _status_only_publish(run)
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
    stored ``notify usage`` event). A run that used the model (:func:`_reached_model`,
    :func:`_used_model`) but
    whose runtime reported no tokens at all is billed an estimate from its prompt, the
    history it carried and the text it streamed (``billing.services.usage_estimate``,
    flagged ``estimated``): no run that used the model is billed zero.

    A run already finished is left as it is (returns it unchanged): the first finish
    wins, which makes retries and races with the reaper harmless and bills a run exactly
    once. Returns ``None`` when the run does not exist.

    A cancel, once accepted (``cancel_requested``), ends the run ``cancelled`` whatever
    the runtime made of it: a run that went on to finish ``done`` anyway (a runtime that
    missed the cancel), or whose sandbox ended (``sandbox_exited``: killed because it did
    not stop), is ``cancelled``; its answer and errors are kept.
    """
    with transaction.atomic():
        run = Run.objects.select_for_update().filter(id=run_id).first()
        if run is None or not run.is_active:
            return run
        if run.cancel_requested and (
            status == Run.Status.DONE
            or (
                status == Run.Status.ERROR and {e.get("code") for e in errors} == {"sandbox_exited"}
            )
        ):
            status = Run.Status.CANCELLED
        if model:
            run.model = model[:200]
        run.answer = answer
        run.usage = usage_normalize(usage if usage is not None else _reported_usage(run.id))
        if run.usage["input"] + run.usage["output"] == 0 and _reached_model(run):
            sent, streamed = run_selectors.run_model_traffic(run=run)
            if _used_model(errors, streamed_chars=streamed):
                run.usage = usage_estimate(
                    sent_chars=sent, streamed_chars=streamed, rounds=run.usage["rounds"]
                )
        _finish(run, status=status, errors=list(errors))
    return run


#: Result error codes of a model call that failed for good (paw-agent: ``auth``, HTTP
#: 401/403 at once; ``unknown``, a call that failed after its retries).
MODEL_FAILURE_CODES = frozenset({"auth", "unknown"})


def _reached_model(run: Run) -> bool:
    """Whether an active run got as far as the model: its runtime acknowledged it
    (``running``: it sends the prompt to the model right after)."""
    return run.status == Run.Status.RUNNING or run.started_at is not None


def _used_model(errors: Sequence[dict[str, str]], *, streamed_chars: int) -> bool:
    """Whether a run that reached the model used it: not when the provider refused the
    credentials (``auth``), nor when a model call failed for good (``unknown``) before
    any text was streamed: the provider answered nothing, so nothing was used."""
    codes = {e.get("code") for e in errors if isinstance(e, dict)}
    if "auth" in codes:
        return False
    return streamed_chars > 0 or not codes & MODEL_FAILURE_CODES


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
    run.result = run_result_with_lineage(run)  # what its answer rests on
    run.save()
    usage_record(run=run)
    # A question nobody can answer any more is closed with the run.
    approvals_cancel_for_run(run_id=run.id)
    run_status_publish(run)
    transaction.on_commit(
        lambda: metrics.run_finished(
            status=status, errors=errors, created_at=run.created_at, finished_at=run.finished_at
        )
    )
