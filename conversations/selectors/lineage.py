"""Reads of what an answer rests on: a finished run's lineage (computed by
``conversations.services.lineage``) and its one-line summary, as the chat and the
exports show it."""

from __future__ import annotations

from typing import Any

from conversations.models import Run


def run_lineage_of(run: Run | None) -> dict[str, Any] | None:
    """``run``'s lineage (``result["lineage"]``), or ``None`` when it has none (no
    datasource, not finished)."""
    result = run.result if run is not None else None
    lineage = result.get("lineage") if isinstance(result, dict) else None
    return lineage if isinstance(lineage, dict) else None


def lineage_summary(lineage: Any) -> str:
    """The lineage in one line of Markdown, as the chat shows it under the answer:
    ``Based on: `orders`, `customers`; doc *Revenue*; example *Monthly revenue*`` (the
    tables read, then the docs and the examples given or retrieved); "" when it names
    none of them."""
    if not isinstance(lineage, dict):
        return ""
    parts = []
    tables = [t for t in lineage.get("tables") or [] if isinstance(t, str)]
    if tables:
        parts.append(", ".join(_code(t) for t in tables))
    entries = [e for e in lineage.get("entries") or [] if isinstance(e, dict)]
    for kind, one, many in (("doc", "doc", "docs"), ("example", "example", "examples")):
        titles = [str(e.get("title") or "") for e in entries if e.get("kind") == kind]
        if titles:
            label = one if len(titles) == 1 else many
            parts.append(f"{label} " + ", ".join(f"*{_escaped(t)}*" for t in titles))
    return "Based on: " + "; ".join(parts) if parts else ""


def _code(text: str) -> str:
    """``text`` as Markdown inline code (a name holding a backtick, fenced with two)."""
    fence = "``" if "`" in text else "`"
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"


def _escaped(text: str) -> str:
    """``text`` with Markdown's emphasis and code characters escaped."""
    for mark in ("\\", "*", "_", "`", "[", "]", "<", ">"):
        text = text.replace(mark, "\\" + mark)
    return " ".join(text.split())
