"""What a run looks like to a person, built from its events (shared by the ``paw`` command
and the ``%%agent`` magic): the streamed text, one row per tool call with its status, the
agent's plan, and notices. :meth:`RunView.feed` returns what each event changed, so a
front end can print increments (the terminal) or redraw in place (a notebook cell)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from paw_client.models import Event

#: Longest tool call label (characters), as the chat page shows it.
CALL_LABEL_CHARS = 100


@dataclass
class ToolRow:
    """One tool call: ``label`` like ``run_python(code='import pandas as pd…')``,
    ``status`` ``running``, ``ok`` or ``error``, and the result's one-line ``summary``."""

    name: str
    label: str
    status: str = "running"
    summary: str = ""


@dataclass
class RunView:
    """The state of a run for display. ``text`` is every streamed delta so far."""

    text: str = ""
    tools: list[ToolRow] = field(default_factory=list)
    plan: list[dict[str, Any]] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)
    result: dict[str, Any] | None = None
    #: The statements of the run's ``run_sql`` calls that returned rows, in order, each
    #: once (the ``sql`` of their ``notify tool`` ``sql_result``).
    sql: list[str] = field(default_factory=list)
    #: The row the latest ``tool`` / ``tool_done`` change was about.
    last_tool: ToolRow | None = None

    def feed(self, event: Event) -> str | None:
        """Take one event; what changed: ``"text"``, ``"tool"`` (a new row),
        ``"tool_done"`` (a row's status), ``"plan"``, ``"notice"``, ``"result"`` or ``None``."""
        kind = event.type
        if kind == "delta":
            self.text += event.text
            return "text"
        if kind == "result":
            self.result = event.event
            return "result"
        if kind in ("notice", "policy_violation"):
            self.notices.append(
                str(event.event.get("message") or event.event.get("detail") or kind)
            )
            return "notice"
        if kind != "notify":
            return None
        data = event.data
        if event.kind == "tool_calls" and isinstance(data, list):
            for call in data:
                if isinstance(call, dict) and call.get("name"):
                    self.last_tool = ToolRow(str(call["name"]), call_label(call))
                    self.tools.append(self.last_tool)
            return "tool"
        if event.kind == "tool" and isinstance(data, dict):
            row = next(
                (r for r in self.tools if r.name == data.get("name") and r.status == "running"),
                None,
            )
            if row is None:
                row = ToolRow(str(data.get("name") or "tool"), str(data.get("name") or "tool"))
                self.tools.append(row)
            row.status = "ok" if data.get("ok", True) else "error"
            row.summary = str(data.get("summary") or "")
            self.last_tool = row
            found = data.get("sql_result")
            statement = found.get("sql") if isinstance(found, dict) else ""
            if (
                row.status == "ok"
                and statement
                and isinstance(statement, str)
                and statement not in self.sql
            ):
                self.sql.append(statement)
            return "tool_done"
        if event.kind == "todos":
            steps = data.get("todos") if isinstance(data, dict) else data
            self.plan = [s for s in steps or [] if isinstance(s, dict)]
            return "plan"
        if event.kind == "error" and isinstance(data, str):
            self.notices.append(data)
            return "notice"
        if event.kind == "retry":
            self.notices.append("The model's provider failed; retrying.")
            return "notice"
        return None


def call_label(call: dict[str, Any]) -> str:
    """``name(key=value, …)`` from a ``tool_calls`` entry (its ``args`` are the runtime's
    short reprs), cut at ``CALL_LABEL_CHARS`` with an ellipsis."""
    args = call.get("args") if isinstance(call.get("args"), dict) else {}
    inner = ", ".join(f"{key}={value}" for key, value in args.items())
    label = f"{call.get('name')}({inner})"
    return label if len(label) <= CALL_LABEL_CHARS else label[: CALL_LABEL_CHARS - 1] + "…"


PLAN_MARKS = {"completed": "[x]", "in_progress": "[~]", "pending": "[ ]"}


def plan_lines(plan: list[dict[str, Any]]) -> list[str]:
    """The plan as checklist lines: ``[x] done``, ``[~] under way``, ``[ ] to do``."""
    return [f"{PLAN_MARKS.get(s.get('status'), '[ ]')} {s.get('content', '')}" for s in plan]


def verified_line(result: Any) -> str | None:
    """ "✓ verified query: <title>" when a run's ``result`` (``Run.result``: ``{datasource,
    sql, columns, rows, row_count, truncated, verified?}``) ran a verified example's SQL
    (``result["verified"]``: ``{id, title, datasource, verified_at}``, decided by PAW),
    else None."""
    verified = result.get("verified") if isinstance(result, dict) else None
    if not isinstance(verified, dict) or not verified.get("title"):
        return None
    return f"✓ verified query: {verified['title']}"
