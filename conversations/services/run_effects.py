"""What a stored runtime line does to its run: decided here, and nowhere else.

The node's event pipeline (``sandboxes.pipeline``) reads, classifies, masks and stores the
lines of its sandboxes; the lines that change something are handed here, as
:class:`RunLine` items, inside the transaction that stored them:

- ``start`` → the run is ``running``, and records whether its runtime is gated
  (``Run.runtime_gated``);
- ``ask`` (``notify ask``) → an :class:`~conversations.models.Approval` (approved at once
  when it is a confirm and the conversation auto-approves; otherwise every tab is asked);
- ``tool_calls`` → each call of a tool in ``PAW_APPROVAL_REQUIRED_TOOLS`` (case and
  surrounding space aside) must be allowed by an approved confirm of the same run naming
  that exact call (tool and arguments), each confirm allowing one call once; a run
  restricted to some tools (``Run.tools``:
  ``POST /api/sql/ask``) may call only those; anything else stops the run
  (``policy_violation``). On an ungated runtime (:attr:`RunControl.gated` false) the call
  has already run by then: the violation says it "ran without asking";
- ``tool`` (``notify tool``) of a ``run_sql`` that returned rows → the run's ``result``
  (its statement, columns, first ``PAW_SQL_RESULT_ROWS`` rows, row count): the last one
  wins; with ``verified`` when its SQL is a verified example's (:func:`verified_query_of`);
- ``sql`` (a ``run_sql`` call the node paired with its ``tool`` line, or with the run's
  end when none came: :class:`SqlCall`) → a row of the audit of data access
  (:func:`sql_statement_audit`: ``audit.services.sql_statement_record``), once per call;
- ``usage`` (running totals) → the run's budgets are checked
  (:class:`~billing.services.RunBudgetGuard`); past one, the run is stopped
  (``budget_exceeded``);
- ``result`` → the run is finished with its answer, errors, model and usage (billed: the
  larger of the result's totals and the last running totals).

A sandbox's exit ends its run, if one was still going (:meth:`RunEffects.sandbox_exited`).

The runtime is untrusted: lines are attributed to the run the host submitted (the
:class:`RunControl` the node hands over), never to the ``run_id`` the runtime writes. What
the domain asks of the node (stop a run, answer the runtime) goes through that
:class:`RunControl`, after commit.
"""

from __future__ import annotations

import datetime
import enum
import json
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from django.conf import settings
from django.db import transaction

from audit.selectors import approval_ids_recorded
from audit.services import sql_statement_record
from billing.services import RunBudgetGuard, usage_merge, usage_normalize
from conversations.models import Approval, Run, RunEvent
from conversations.services import approvals as approval_services
from conversations.services import events as event_services
from conversations.services import runs as run_services
from conversations.services.approvals import call_key, tool_name_key
from paw_project import metrics
from secrets_vault.selectors import datasource_list, verified_example_matching

logger = logging.getLogger(__name__)

#: Longest answer stored for a run (characters).
MAX_ANSWER_CHARS = 100_000
#: Most characters of JSON the rows of a run's ``result`` take.
MAX_RESULT_CHARS = 512 * 1024
#: How a policy violation on an ungated runtime ends its message: the call has run.
_RAN_WITHOUT_ASKING = (
    "ran without asking: this agent runtime runs its tools itself and tells PAW only "
    "afterwards, so PAW could not prevent it, only end the run after it (approvals apply "
    "to paw-agent only)."
)


class LineKind(enum.StrEnum):
    """The kinds of runtime line that have an effect on their run."""

    START = "start"
    ASK = "ask"
    TOOL_CALLS = "tool_calls"
    TOOL = "tool"
    SQL = "sql"
    USAGE = "usage"
    RESULT = "result"


class RunControl(Protocol):
    """The node's handle on a run it executes (``sandboxes.run.ActiveRun``).

    ``forced``: ``(code, message)`` when the host ended the run itself (timeout, budget,
    policy, a stop), else ``None``. ``usage``: the runtime's latest running totals
    (``{"input", "output", "rounds", "estimated"}``, unchecked), or ``None``.
    ``allowed_tools``: the only tools the run may use (its submit's ``tools``), or ``None``
    for any. ``gated``: whether its runtime asks before its risky tools act (its ``ready``
    offers ``approval_gate``, as paw-agent's does); an *ungated* one (python-agent-harness)
    runs its tools itself and tells the host only afterwards, so a call PAW refuses has
    already run when PAW hears of it.
    """

    run_id: UUID
    user_id: int
    forced: tuple[str, str] | None
    usage: dict[str, Any] | None
    allowed_tools: frozenset[str] | None
    gated: bool

    def force_end(self, *, code: str, message: str) -> None:
        """Stop the run for a host reason (it ends ``error`` with ``code``)."""

    def answer(self, *, answers: list[str], ask_id: str | None) -> None:
        """Write an ``answer`` op for the run."""


@dataclass(frozen=True)
class SqlCall:
    """A ``run_sql`` call of a run, as the node paired it (``sandboxes.run.ActiveRun``):
    ``ordinal``, its place among the run's ``run_sql`` calls (1, 2 …, counted by the
    node); ``conversation_id``, the run's conversation (the node's); ``call``, the
    ``tool_calls`` item that announced it (masked: ``{"name", "args", "input":
    {"datasource", "query"}}``, as the runtime wrote it); ``at``, when the node read that
    announcement (aware, UTC); ``result``, the call's ``notify tool`` ``data`` (masked),
    or ``None`` when the run ended without one."""

    ordinal: int
    conversation_id: UUID
    call: dict[str, Any]
    at: datetime.datetime
    result: dict[str, Any] | None = None


@dataclass(frozen=True)
class RunLine:
    """A stored line with an effect: its ``kind`` and ``data`` (masked): ``ask``: the
    ask's ``data`` object; ``tool_calls``: the list of calls; ``tool``: the finished
    call's ``data``; ``sql``: a :class:`SqlCall`; ``usage``: the running totals;
    ``result``: the whole ``result`` line; ``start``: ``None``."""

    run: RunControl
    kind: LineKind
    data: Any = None


def result_outcome(raw: dict[str, Any], forced: tuple[str, str] | None) -> dict[str, Any]:
    """The run's final state from a ``result`` line (PROTOCOL.md: the only source of truth
    for the outcome): ``{"status", "answer", "errors", "model", "usage"}``. ``forced`` is
    the host's own reason when it ended the run (timeout, budget, policy): a cancelled
    result then ends the run ``error`` with that code."""
    errors = []
    for item in raw.get("errors") or []:
        if isinstance(item, dict):
            errors.append(
                run_services.error_entry(
                    str(item.get("code") or "unknown")[:64], str(item.get("message") or "")[:5000]
                )
            )
        elif isinstance(item, str):
            errors.append(run_services.error_entry("unknown", item[:5000]))
    usage = usage_normalize(raw.get("usage"))
    if forced is not None:
        status = Run.Status.ERROR
        errors = [run_services.error_entry(*forced)]
    elif raw.get("cancelled") is True:
        status = Run.Status.CANCELLED
    elif errors:
        status = Run.Status.ERROR
    else:
        status = Run.Status.DONE
    answer = raw.get("answer") if isinstance(raw.get("answer"), str) else ""
    model = raw.get("model") if isinstance(raw.get("model"), str) else ""
    return {
        "status": status,
        "answer": answer[:MAX_ANSWER_CHARS],
        "errors": errors,
        "model": model,
        "usage": usage,
    }


def sql_result_of(data: Any) -> dict[str, Any] | None:
    """The run's ``result`` from a ``notify tool`` line's ``data``, when it is a
    ``run_sql`` that returned rows (paw-agent's ``sql_result``: ``{"datasource", "sql",
    "columns", "rows", "row_count", "truncated"}``), checked and cut to
    ``PAW_SQL_RESULT_ROWS`` rows (and ``MAX_RESULT_CHARS`` of JSON); else ``None``. The
    runtime is untrusted: anything of another shape is ignored."""
    if not isinstance(data, dict) or data.get("name") != "run_sql" or data.get("ok") is not True:
        return None
    raw = data.get("sql_result")
    if not isinstance(raw, dict):
        return None
    columns, rows, row_count = raw.get("columns"), raw.get("rows"), raw.get("row_count")
    if (
        not isinstance(columns, list)
        or not all(isinstance(c, str) for c in columns)
        or not isinstance(rows, list)
        or not all(isinstance(r, list) and len(r) == len(columns) for r in rows)
        or not isinstance(row_count, int)
        or isinstance(row_count, bool)
    ):
        return None
    kept, size = [], 0
    for row in rows[: settings.PAW_SQL_RESULT_ROWS]:
        size += len(json.dumps(row, ensure_ascii=False, default=str))
        if size > MAX_RESULT_CHARS:
            break
        kept.append(row)
    row_count = max(row_count, len(rows))
    return {
        "datasource": str(raw.get("datasource") or "")[:100],
        "sql": str(raw.get("sql") or "")[:MAX_ANSWER_CHARS],
        "columns": [c[:500] for c in columns],
        "rows": kept,
        "row_count": row_count,
        "truncated": len(kept) < row_count,
    }


def verified_query_of(*, run_id: UUID, result: dict[str, Any]) -> dict[str, Any] | None:
    """``{"id", "title", "datasource", "verified_at"}`` (ISO 8601) of the verified example
    whose SQL is the SQL of the run's ``result`` (:func:`sql_result_of`) as parsed
    (``secrets_vault.selectors.verified_example_matching``), else None. Decided here from
    PAW's own database, never by the runtime: only a datasource the run was given
    (``Run.datasources``, the host's) is looked at, whatever the runtime says it ran on."""
    slug = result.get("datasource")
    given = Run.objects.filter(id=run_id).values_list("datasources", flat=True).first() or []
    if not slug or slug not in given:
        return None
    example = verified_example_matching(datasource_slug=slug, sql=result.get("sql") or "")
    if example is None or example.verified_at is None:
        return None
    return {
        "id": example.pk,
        "title": example.title,
        "datasource": slug,
        "verified_at": example.verified_at.isoformat(),
    }


#: What a runtime may give as a statement's error code; anything else is ``database_error``.
_ERROR_CODE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")


def _count(value: Any) -> int | None:
    """A non-negative integer from the runtime, else ``None``."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def sql_outcome_of(result: dict[str, Any] | None) -> tuple[str, int | None, int | None]:
    """``(outcome, row_count, duration_ms)`` of a ``run_sql`` call from its ``notify
    tool`` ``data`` (``None``: the run ended first → ``interrupted``). paw-agent's
    ``sql_run`` (``{"duration_ms", "row_count", "error", "explained"}``) says what a
    statement sent to the database did (``check_failed``: only the ``EXPLAIN`` of its
    check before running was sent, which refused it); a failed call without it never
    reached the database by the runtime's word: ``check_failed`` when its ``sql_check``
    refused it (the statement does not parse), else ``refused`` (read-only datasource,
    bad arguments …). The runtime is untrusted: an error code not of the form
    ``[a-z][a-z0-9_]*`` (64 at most) is ``database_error``, a count that is not a
    non-negative integer is ``None``."""
    if not isinstance(result, dict):
        return "interrupted", None, None
    run = result.get("sql_run") if isinstance(result.get("sql_run"), dict) else {}
    rows = _count(run.get("row_count"))
    if rows is None and isinstance(result.get("sql_result"), dict):
        rows = _count(result["sql_result"].get("row_count"))
    duration = _count(run.get("duration_ms"))
    if result.get("ok") is True:
        return "ok", rows, duration
    if not run:
        check = result.get("sql_check")
        if isinstance(check, dict) and check.get("ok") is False:
            return "check_failed", None, None
        return "refused", None, None
    error = run.get("error")
    code = error if isinstance(error, str) and _ERROR_CODE.match(error) else "database_error"
    return code, rows, duration


def _confirm_of(run_id: UUID, call: dict[str, Any]) -> Approval | None:
    """The decided confirm of run ``run_id`` that named ``call`` (the same
    :func:`call_key`) and that no recorded statement names yet, the oldest first."""
    key = call_key(call)
    if key is None:
        return None
    taken = approval_ids_recorded(run_id=run_id)
    confirms = Approval.objects.filter(
        run_id=run_id, kind=Approval.Kind.CONFIRM, call__isnull=False, decided_at__isnull=False
    ).select_related("decided_by_user", "conversation__user")
    for approval in confirms.order_by("created_at"):
        if approval.id not in taken and call_key(approval.call) == key:
            return approval
    return None


def sql_statement_audit(control: RunControl, sql: SqlCall) -> None:
    """Record a ``run_sql`` call of a run in the audit of data access (once per call:
    ``audit.services.sql_statement_record`` keeps one row per run and ordinal). The user
    and conversation are the run's (the host's, never the runtime's); the datasource and
    statement are those the call announced (masked), judged ``read`` or ``write`` on the
    datasource's dialect. A write's approver comes from the confirm that named this very
    call: the person who approved it, or the conversation's owner when it auto-approved;
    a confirm declined or expired makes a failed call ``declined``. Outcome, rows and
    duration: :func:`sql_outcome_of`; ``explained``: the runtime's ``sql_run`` says an
    ``EXPLAIN`` of the statement was sent first (its check before running). Recorded even
    when the conversation was deleted meanwhile (the statement was sent all the same)."""
    given = sql.call.get("input") if isinstance(sql.call.get("input"), dict) else {}
    slug = str(given.get("datasource") or "")
    query = given.get("query")
    statement = query if isinstance(query, str) else json.dumps(query, default=str)
    dialect = (
        datasource_list(enabled_only=False).filter(slug=slug).values_list("dialect", flat=True)
    ).first()
    outcome, row_count, duration_ms = sql_outcome_of(sql.result)
    run = sql.result.get("sql_run") if isinstance(sql.result, dict) else None
    explained = isinstance(run, dict) and run.get("explained") is True
    approval = _confirm_of(control.run_id, sql.call)
    approved = approval is not None and approval.status == Approval.Status.APPROVED
    if approval is not None and not approved and outcome != "ok":
        outcome = "declined"
    approver = None
    if approved:
        approver = approval.decided_by_user or (
            approval.conversation.user if approval.decided_by == "auto" else None
        )
    sql_statement_record(
        run_id=control.run_id,
        ordinal=sql.ordinal,
        time=sql.at,
        user_id=control.user_id,
        conversation_id=sql.conversation_id,
        datasource=slug,
        dialect=dialect,
        statement=statement,
        outcome=outcome,
        explained=explained,
        row_count=row_count,
        duration_ms=duration_ms,
        approval_id=approval.id if approval is not None else None,
        approved_by=approver.get_username() if approver is not None else "",
        approved_via=("auto" if approval.decided_by == "auto" else "user") if approved else "",
    )


def gated_calls_of(calls: Any) -> list[dict[str, Any]]:
    """The calls of a ``tool_calls`` list that need an approved confirm of their own: those
    of a tool in ``PAW_APPROVAL_REQUIRED_TOOLS`` (names compared with
    :func:`tool_name_key`), in order."""
    required = {tool_name_key(name) for name in settings.PAW_APPROVAL_REQUIRED_TOOLS}
    required.discard("")
    if not isinstance(calls, list):
        return []
    return [c for c in calls if isinstance(c, dict) and tool_name_key(c.get("name")) in required]


class RunEffects:
    """Applies the effects of stored lines (see the module docstring). One per node's
    event pipeline, used by its writer thread only: it keeps the budgets of the runs
    going on (:class:`~billing.services.RunBudgetGuard`)."""

    def __init__(self) -> None:
        self._budgets = RunBudgetGuard()

    def apply(self, lines: Sequence[RunLine]) -> None:
        """Apply ``lines`` (in the order they were stored), inside the caller's
        transaction. What must reach the node or the tabs is sent after commit."""
        ended = {line.run.run_id for line in lines if line.kind is LineKind.RESULT}
        usage: dict[UUID, RunLine] = {}
        results: dict[UUID, dict[str, Any]] = {}
        for line in lines:
            if line.kind is LineKind.START:
                run_services.run_mark_running(run_id=line.run.run_id, runtime_gated=line.run.gated)
            elif line.kind is LineKind.ASK:
                self._ask(line.run, line.data)
            elif line.kind is LineKind.TOOL_CALLS:
                self._check_policy(line.run, line.data)
            elif line.kind is LineKind.TOOL:
                result = sql_result_of(line.data)
                if result is not None:
                    results[line.run.run_id] = result  # the run's last query wins
            elif line.kind is LineKind.SQL:
                sql_statement_audit(line.run, line.data)
            elif line.kind is LineKind.USAGE:
                usage[line.run.run_id] = line  # only the latest totals need a check
        for run_id, result in results.items():
            verified = verified_query_of(run_id=run_id, result=result)
            if verified is not None:
                result["verified"] = verified
            run_services.run_result_record(run_id=run_id, result=result)
        for run_id, line in usage.items():
            if run_id not in ended:
                self._check_budget(line.run, usage_normalize(line.data))
        for line in lines:
            if line.kind is LineKind.RESULT:
                self._finish(line.run, line.data)

    def sandbox_exited(
        self, *, run: RunControl | None, conversation_id: UUID, exit_code: int | None,
        stderr_tail: str, expected: bool,
    ) -> None:  # fmt: skip
        """A sandbox's process ended (``expected``: PAW stopped it). Its run, if one was
        going, ends ``error``: with the host's reason when it ended the run itself, else
        "sandbox exited (code N)" and the end of its stderr (``stderr_tail``, masked);
        billed for the last running totals it reported. An unexpected exit between runs
        leaves a notice. Call inside a transaction."""
        if run is not None:
            self._budgets.forget(run.run_id)
            forced = run.forced or _violation_of(run.run_id)
            if forced is not None:
                code, message = forced
            else:
                code = "sandbox_exited"
                message = f"sandbox exited (code {exit_code})"
                if stderr_tail:
                    message += f": {stderr_tail[-2000:]}"
            run_services.run_finish(
                run_id=run.run_id,
                status=Run.Status.ERROR,
                errors=[run_services.error_entry(code, message)],
                usage=run.usage,
            )
        elif not expected:
            event_services.notice_append(
                conversation_id=conversation_id,
                run_id=None,
                code="sandbox_exited",
                message=f"The agent's sandbox exited unexpectedly (code {exit_code}); the next run starts a new one.",
            )

    # --- one kind each ----------------------------------------------------------------------

    @staticmethod
    def _ask(control: RunControl, data: Any) -> None:
        if not isinstance(data, dict):
            return
        run = (
            Run.objects.filter(id=control.run_id, status__in=Run.ACTIVE_STATUSES)
            .select_related("conversation")
            .first()
        )
        if run is None:
            return
        approval = approval_services.approval_create(run=run, data=data)
        if approval.kind == Approval.Kind.CONFIRM and run.conversation.auto_approve:
            # Decided at once: the tabs hear of the decision only, nobody is asked.
            transaction.on_commit(lambda: _auto_approve(control, approval.id))
            return
        approval_services.approval_request_publish(approval)

    @classmethod
    def _check_policy(cls, control: RunControl, calls: Any) -> tuple[str, str] | None:
        """The host does not trust the runtime: a run restricted to some tools may call
        only those, and each call of a tool in ``PAW_APPROVAL_REQUIRED_TOOLS`` must be
        allowed by an approved confirm of the same run that names that very call (tool and
        arguments: :func:`call_key`) and allowed no call before. A call against either rule
        stops the run and is recorded as a ``policy_violation``; returns the run's error
        then (``("policy_violation", message)``), else ``None``. A gated runtime announces
        a call before it acts, so PAW "stopped" it; an ungated one (``control.gated``
        false) has run it already, and the message says so ("ran without asking")."""
        if control.allowed_tools is not None and isinstance(calls, list):
            names = {c.get("name") for c in calls if isinstance(c, dict)}
            outside = sorted(str(name) for name in names - control.allowed_tools)
            if outside:
                allowed = ", ".join(sorted(control.allowed_tools))
                used = ", ".join(outside)
                return cls._violation(
                    control,
                    tools=outside,
                    kind="tool_not_allowed",
                    message=(
                        f"The agent tried to use {used}, which this run may not use (only "
                        f"{allowed}), so PAW stopped the run."
                        if control.gated
                        else f"The agent used {used}, which this run may not use (only "
                        f"{allowed}); the call {_RAN_WITHOUT_ASKING}"
                    ),
                )
        gated = gated_calls_of(calls)
        if not gated:
            return None
        unmatched = approval_services.approvals_use(
            run_id=control.run_id, keys=[call_key(call) for call in gated]
        )
        if not unmatched:
            return None
        tools = sorted({str(gated[i].get("name")) for i in unmatched})
        used = ", ".join(tools)
        return cls._violation(
            control,
            tools=tools,
            kind="approval_required",
            message=(
                f"The agent tried to use {used} without your approval of that exact call, so "
                "PAW stopped the run."
                if control.gated
                else f"The agent's {used} call {_RAN_WITHOUT_ASKING}"
            ),
        )

    @staticmethod
    def _violation(
        control: RunControl, *, tools: list[str], kind: str, message: str
    ) -> tuple[str, str]:
        """Record a ``policy_violation`` event (``kind``: ``approval_required`` or
        ``tool_not_allowed``) and stop the run after commit; returns the run's error
        ``("policy_violation", message)``. One event per run: calls a runtime announces
        while it is being stopped are only logged."""
        run_id = control.run_id
        reason = ("policy_violation", message)
        run = Run.objects.filter(id=run_id).only("conversation_id").first()
        if run is None:
            return reason
        if RunEvent.objects.filter(run_id=run_id, type="policy_violation").exists():
            logger.warning("run %s: further policy violation (%s)", run_id, ", ".join(tools))
            return reason
        event_services.events_append(
            conversation_id=run.conversation_id,
            drafts=[
                event_services.EventDraft(
                    run_id=run_id,
                    type="policy_violation",
                    kind=kind,
                    payload={"type": "policy_violation", "tools": tools, "message": message},
                )
            ],
        )
        logger.warning("run %s: policy violation (%s: %s)", run_id, kind, ", ".join(tools))
        transaction.on_commit(lambda: control.force_end(code="policy_violation", message=message))
        return reason

    def _check_budget(self, control: RunControl, usage: dict[str, Any]) -> None:
        """Stop a run that went past its token budget (per run or monthly): after commit;
        it then ends ``error`` ``budget_exceeded``, billed for what it used. Cheap: the
        run's limits are cached (:class:`RunBudgetGuard`)."""
        reason = self._budgets.check(run_id=control.run_id, user_id=control.user_id, usage=usage)
        if reason is None or control.forced is not None:
            return
        logger.warning("run %s: token budget exceeded; stopping it", control.run_id)
        transaction.on_commit(lambda: metrics.budget_refused(stage="run"))
        transaction.on_commit(lambda: control.force_end(code="budget_exceeded", message=reason))

    def _finish(self, control: RunControl, raw: dict[str, Any]) -> None:
        """Finish the run with its ``result`` line ``raw``. A run with a recorded policy
        violation ends ``error`` ``policy_violation`` even when the host's stop never
        reached the runtime (the result was read before it, in the same batch or while the
        pipeline caught up)."""
        outcome = result_outcome(raw, control.forced or _violation_of(control.run_id))
        outcome["usage"] = usage_merge(outcome["usage"], control.usage)
        self._budgets.forget(control.run_id)
        run_services.run_finish(run_id=control.run_id, **outcome)


def _violation_of(run_id: UUID) -> tuple[str, str] | None:
    """``("policy_violation", message)`` when a policy violation of the run is recorded
    (one ``policy_violation`` event per run), else ``None``."""
    payload = (
        RunEvent.objects.filter(run_id=run_id, type="policy_violation")
        .values_list("payload", flat=True)
        .first()
    )
    if payload is None:
        return None
    message = payload.get("message") if isinstance(payload, dict) else None
    return ("policy_violation", str(message or "policy violation"))


def _auto_approve(control: RunControl, approval_id: UUID) -> None:
    """Approve a confirm on the conversation's behalf and answer the runtime at once."""
    try:
        approval = approval_services.approval_decide(
            approval_id=approval_id, approved=True, decided_by="auto", via="auto"
        )
        control.answer(answers=["yes"], ask_id=approval.ask_id or None)
    except Exception:  # the approval stays pending and expires at its deadline
        logger.exception("auto-approve of %s failed", approval_id)
