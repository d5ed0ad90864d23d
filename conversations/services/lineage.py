"""What an answer rests on: a run's *lineage*, computed by PAW, never taken from the
runtime's word (docs/data.md, "What an answer rests on").

A run on datasources records (in ``Run.result["lineage"]``, when it finishes):

- ``datasources``: the slugs of the datasources it was given (``Run.datasources``);
- ``entries``: the knowledge entries it was **given** with its submit (the worker's
  choice, :func:`run_knowledge_given_record`) and those its ``search_knowledge`` calls
  **retrieved** (the ids paw-agent names in the call's ``notify tool`` ``entries``,
  kept only when they are entries of the run's datasources; kind and title are PAW's
  own), ``{"id", "kind", "title", "datasource", "source": "given" | "retrieved"}`` each,
  an entry given and retrieved listed once, as given;
- ``tables`` and ``columns``: what the statements it sent read (``table.column`` where
  the table can be told), parsed by ``paw_sqlcheck.references`` from the audit's rows
  of the run (the node's record of each ``run_sql`` call), the statements that ran
  (outcome ``ok``) only.

The shape is fixed: the chat, the API, the exports and the notebook magic read it.
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

from audit.selectors import sql_statements_of_run
from conversations.models import Run, RunEvent
from paw_sqlcheck.references import statement_references
from secrets_vault.selectors import (
    datasource_list,
    knowledge_entries_named,
    knowledge_schema_columns,
)

#: Most entries a lineage lists (given and retrieved together).
MAX_ENTRIES = 200
#: Most tables, and columns, a lineage lists.
MAX_NAMES = 500


def run_knowledge_given_record(*, run_id: UUID, entries: list[dict[str, Any]]) -> None:
    """On the worker, before the submit: keep which knowledge entries run ``run_id`` is
    given (``entries`` as ``secrets_vault.services.knowledge_for_run`` returns them:
    ``{"id", "kind", "title", "datasource", …}``; only those four are kept), while the
    run is active."""
    given = [
        {
            "id": entry["id"],
            "kind": str(entry.get("kind") or ""),
            "title": str(entry.get("title") or ""),
            "datasource": str(entry.get("datasource") or ""),
        }
        for entry in entries
        if isinstance(entry.get("id"), int)
    ]
    Run.objects.filter(id=run_id, status__in=Run.ACTIVE_STATUSES).update(knowledge_given=given)


def run_lineage(run: Run) -> dict[str, Any] | None:
    """The lineage of ``run`` (see the module docstring), or ``None`` for a run on no
    datasource. Reads the run's stored events and audit rows: call when it finishes."""
    slugs = [str(slug) for slug in run.datasources or []]
    if not slugs:
        return None
    entries: list[dict[str, Any]] = []
    seen: set[int] = set()
    for entry in run.knowledge_given or []:
        if isinstance(entry, dict) and isinstance(entry.get("id"), int) and entry["id"] not in seen:
            seen.add(entry["id"])
            entries.append({**_entry(entry), "source": "given"})
    wanted = [i for i in _retrieved_ids(run.id) if i not in seen]
    named = knowledge_entries_named(entry_ids=wanted, datasource_slugs=slugs)
    for entry_id in wanted:
        if entry_id in named and entry_id not in seen:
            seen.add(entry_id)
            entries.append({**_entry(named[entry_id]), "source": "retrieved"})
    tables, columns = _read_names(run.id, slugs)
    return {
        "datasources": slugs,
        "entries": entries[:MAX_ENTRIES],
        "tables": tables[:MAX_NAMES],
        "columns": columns[:MAX_NAMES],
    }


def run_result_with_lineage(run: Run) -> dict[str, Any] | None:
    """``run.result`` with the run's lineage under ``"lineage"`` (``{"lineage": …}`` for a
    run without an SQL result); unchanged for a run on no datasource."""
    lineage = run_lineage(run)
    if lineage is None:
        return run.result
    return {**(run.result if isinstance(run.result, dict) else {}), "lineage": lineage}


def _entry(entry: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": entry["id"],
        "kind": str(entry.get("kind") or ""),
        "title": str(entry.get("title") or ""),
        "datasource": str(entry.get("datasource") or ""),
    }


def _retrieved_ids(run_id: UUID) -> list[int]:
    """The entry ids the run's successful ``search_knowledge`` calls named (their ``notify
    tool`` ``entries``, ``[{"id", …}]``), in order, once each. The runtime's word: the
    caller checks each against PAW's rows."""
    ids: list[int] = []
    payloads = RunEvent.objects.filter(
        run_id=run_id, type="notify", kind="tool", payload__data__name="search_knowledge"
    ).order_by("cursor")
    for payload in payloads.values_list("payload", flat=True):
        data = payload.get("data") if isinstance(payload, dict) else None
        if not isinstance(data, dict) or data.get("ok") is not True:
            continue
        found = data.get("entries")
        for item in found if isinstance(found, list) else []:
            entry_id = item.get("id") if isinstance(item, dict) else None
            if isinstance(entry_id, int) and not isinstance(entry_id, bool) and entry_id not in ids:
                ids.append(entry_id)
                if len(ids) >= MAX_ENTRIES:
                    return ids
    return ids


def _read_names(run_id: UUID, slugs: list[str]) -> tuple[list[str], list[str]]:
    """The tables and columns the run's statements that ran read, each sorted once
    (:func:`paw_sqlcheck.references.statement_references`, on each datasource's dialect
    and harvested schema)."""
    statements = [
        (slug, sql)
        for slug, sql, outcome in sql_statements_of_run(run_id=run_id)
        if outcome == "ok"
    ]
    if not statements:
        return [], []
    used = sorted({slug for slug, _ in statements})
    dialects = dict(
        datasource_list(enabled_only=False).filter(slug__in=used).values_list("slug", "dialect")
    )
    statements = [(slug, sql) for slug, sql in statements if slug in dialects]
    # The tables first (no schema needed), then the schema of those only, to place the
    # columns: a run on a datasource of thousands of tables reads a few entries.
    named: dict[str, set[str]] = {slug: set() for slug in used}
    for slug, sql in statements:
        named[slug].update(statement_references(sql, dialect=dialects[slug]).tables)
    schemas = {
        slug: knowledge_schema_columns(datasource_slug=slug, tables=sorted(named[slug]))
        for slug in used
    }
    tables: set[str] = set()
    columns: set[str] = set()
    for slug, sql in statements:
        found = statement_references(sql, dialect=dialects[slug], schema=schemas[slug])
        tables.update(found.tables)
        columns.update(found.columns)
    return sorted(tables), sorted(columns)
