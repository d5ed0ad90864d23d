"""What a run on datasources is given: the knowledge entries for its prompt, chosen so
that the schema of the tables the question needs comes with the docs and examples that
explain it, within a token budget.

Ranking every entry on one list by how many of the question's words it shares fills the
budget with docs and examples that repeat the question, and leaves out the tables its SQL
needs: a table's entry is its name and column names, which a question rarely spells
("How many drivers born after 1980 finished a race?" needs ``results``). So the context
is chosen in three steps (measured on BIRD's mini-dev set, docs/performance.md,
"Datasource knowledge on BIRD"):

1. Each kind is searched on its own (``selectors.knowledge_search`` with ``kinds``): the
   docs, the examples and the schema entries nearest the prompt.
2. Tables are scored from three kinds of evidence, each by reciprocal rank (k = 60, as
   the search's own fusion): the schema entries found for the prompt; the schema entries
   found for the prompt *expanded* by the best docs' and examples' texts (pseudo-relevance
   feedback: Rocchio, 1971; Lavrenko and Croft, 2001: an evidence note says ``Currency``,
   an example's SQL says ``yearmonth``); the tables the best examples' SQL reads, parsed
   by sqlglot (a related question's query names the tables exactly). Then each scored
   table lends a share of its score to the tables its foreign keys join it to, both ways
   (the join path a question needs: Wang et al., RAT-SQL, 2020, on schema linking).
3. The budget is packed: the best docs up to :data:`DOC_SHARE` of it, the best examples up
   to :data:`EXAMPLE_SHARE` (verified ones first: :func:`verified_examples_first`), the
   tables by score in what is left, then whatever still fits, in the order of the three
   searches.
"""

from __future__ import annotations

import collections
import math
import re
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from secrets_vault.models import Datasource, KnowledgeEntry
from secrets_vault.selectors import RRF_K, knowledge_search

#: Shares of the budget the best docs and the best examples may take before the tables.
DOC_SHARE = 0.2
EXAMPLE_SHARE = 0.25
#: Entries searched per kind, and how many of the best docs and examples feed the
#: expanded query and the tables of step 2.
SEARCHED = 30
FEEDBACK_DOCS = 3
FEEDBACK_EXAMPLES = 5
#: Weights of the table evidence of step 2 (the prompt's own schema search is 1).
EXPANDED_WEIGHT = 1.0
EXAMPLE_WEIGHT = 2.0
#: Share of a table's score lent to each table a foreign key joins it to.
NEIGHBOUR_SHARE = 0.5
#: Characters of the expanded query (the docs' and examples' texts are cut to it).
EXPANDED_CHARS = 4000
#: The dialect names of sqlglot for PAW's.
SQLGLOT_DIALECTS = {"postgresql": "postgres", "mysql": "mysql", "sqlite": "sqlite"}
_REFERENCE = re.compile(r"references ([^\s(]+)\(", re.IGNORECASE)


def _tables_read(sql: str, dialect: str) -> frozenset[str]:
    """The tables an example's SQL reads (lower case, as written: ``schema.table`` or
    ``table``), parsed by sqlglot; CTE names left out; empty when it does not parse."""
    key = (sql, dialect)
    with _PARSED_LOCK:
        if key in _PARSED:
            _PARSED.move_to_end(key)
            return _PARSED[key]
    import sqlglot
    from sqlglot import exp

    try:
        trees = [tree for tree in sqlglot.parse(sql, read=SQLGLOT_DIALECTS.get(dialect)) if tree]
    except Exception:  # sqlglot raises several errors; any means "not understood"
        trees = []
    names: set[str] = set()
    for tree in trees:
        ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
        for table in tree.find_all(exp.Table):
            name = table.name.lower()
            if name and name not in ctes:
                names.add(f"{table.db.lower()}.{name}" if table.db else name)
    found = frozenset(names)
    with _PARSED_LOCK:
        _PARSED[key] = found
        while len(_PARSED) > PARSED_CACHE_SIZE:
            _PARSED.popitem(last=False)
    return found


#: Examples' parsed tables kept per process (an example's SQL rarely changes).
PARSED_CACHE_SIZE = 4096
_PARSED: collections.OrderedDict[tuple[str, str], frozenset[str]] = collections.OrderedDict()
_PARSED_LOCK = threading.Lock()


def _name_keys(title: str) -> set[str]:
    """The names SQL may give a schema entry's table: its title lower-cased, without
    quotes, and its bare name when qualified (``formula_1.races`` → also ``races``)."""
    name = title.lower().replace('"', "").replace("`", "")
    return {name, name.rsplit(".", 1)[-1]}


def context_select(
    *,
    datasources: list[Datasource],
    prompt: str,
    budget: int,
    cost: Callable[[KnowledgeEntry], int],
    query_vector: np.ndarray | None = None,
    vector_model: str = "",
) -> list[KnowledgeEntry]:
    """The entries of ``datasources`` a run on ``prompt`` is given (see the module's
    docstring), whose ``cost`` (tokens of an entry as the run is given it) sums to at most
    ``budget``: schema entries first, then docs, then examples, each by relevance.
    Flagged entries (``flag_reason``) are never chosen. ``query_vector`` (normalised, by
    ``vector_model``) adds the vector ranking to each search."""
    ids = [d.pk for d in datasources]
    dialects = {d.pk: d.dialect for d in datasources}

    def search(query: str, kind: str, vector: bool = True) -> list[KnowledgeEntry]:
        hits = knowledge_search(
            datasource_ids=ids,
            query=query,
            limit=SEARCHED,
            query_vector=query_vector if vector else None,
            vector_model=vector_model if vector else "",
            kinds=(kind,),
        )
        return [hit.entry for hit in hits if not hit.entry.flag_reason]

    docs = search(prompt, KnowledgeEntry.Kind.DOC)
    examples = search(prompt, KnowledgeEntry.Kind.EXAMPLE)
    schema = search(prompt, KnowledgeEntry.Kind.SCHEMA)
    feedback = [prompt]
    feedback += [f"{d.title} {d.text}" for d in docs[:FEEDBACK_DOCS]]
    feedback += [f"{e.title} {e.sql}" for e in examples[:FEEDBACK_EXAMPLES]]
    expanded = search(" ".join(feedback)[:EXPANDED_CHARS], KnowledgeEntry.Kind.SCHEMA, False)

    scores: dict[int, float] = collections.defaultdict(float)
    tables: dict[int, KnowledgeEntry] = {}
    for weight, ranking in ((1.0, schema), (EXPANDED_WEIGHT, expanded)):
        for rank, entry in enumerate(ranking):
            scores[entry.pk] += weight / (RRF_K + rank + 1)
            tables[entry.pk] = entry
    wanted: dict[tuple[int, str], float] = collections.defaultdict(float)
    for rank, example in enumerate(examples[:FEEDBACK_EXAMPLES]):
        for name in _tables_read(example.sql, dialects[example.datasource_id]):
            wanted[(example.datasource_id, name)] += EXAMPLE_WEIGHT / (RRF_K + rank + 1)
    for entry in _schema_named(ids, {key for key in wanted}, known=tables):
        tables[entry.pk] = entry
    by_name = _name_index(tables.values())
    for (datasource_id, name), score in wanted.items():
        for entry_id in by_name.get((datasource_id, name), ()):
            scores[entry_id] += score
    _lend_to_neighbours(scores, tables, ids)

    chosen: list[KnowledgeEntry] = []
    left = budget

    def take(entry: KnowledgeEntry, within: float) -> float:
        nonlocal left
        price = cost(entry)
        if entry in chosen or price > left or price > within:
            return within
        chosen.append(entry)
        left -= price
        return within - price

    share = budget * DOC_SHARE
    for entry in docs:
        share = take(entry, share)
    share = budget * EXAMPLE_SHARE
    for entry in verified_examples_first(examples):
        share = take(entry, share)
    for entry_id in sorted(scores, key=lambda i: (-scores[i], i)):
        if not tables[entry_id].flag_reason:
            take(tables[entry_id], math.inf)
    for entry in [*docs, *examples, *schema]:
        take(entry, math.inf)
    order = {KnowledgeEntry.Kind.SCHEMA: 0, KnowledgeEntry.Kind.DOC: 1, KnowledgeEntry.Kind.EXAMPLE: 2}
    return sorted(chosen, key=lambda entry: order.get(entry.kind, 3))  # stable: by relevance


def verified_examples_first(examples: list[KnowledgeEntry]) -> list[KnowledgeEntry]:
    """``examples`` (most relevant first) with the verified ones first, each group in its
    order (a staff member checked them: docs/data.md, "Verified examples"). paw-agent's
    ``search_knowledge`` orders its results by the same rule."""
    return sorted(examples, key=lambda entry: entry.verified_at is None)


def _name_index(entries: Any) -> dict[tuple[int, str], list[int]]:
    """``(datasource id, name as SQL may write it)`` → schema entry ids."""
    index: dict[tuple[int, str], list[int]] = collections.defaultdict(list)
    for entry in entries:
        for key in _name_keys(entry.title):
            index[(entry.datasource_id, key)].append(entry.pk)
    return index


def _schema_named(
    datasource_ids: list[int], names: set[tuple[int, str]], *, known: dict[int, KnowledgeEntry]
) -> list[KnowledgeEntry]:
    """The schema entries (not yet ``known``) whose table is one of ``names``
    (``(datasource id, lower-case name)``), in one query. Titles are matched by their
    last part too, so an unqualified name finds ``schema.table``."""
    if not names:
        return []
    from django.db.models import Q
    from django.db.models.functions import Lower

    query = Q()
    for datasource_id, name in names:
        bare = name.rsplit(".", 1)[-1]
        query |= Q(datasource_id=datasource_id) & (
            Q(title_lower=name) | Q(title_lower=bare) | Q(title_lower__endswith=f".{bare}")
        )
    return list(
        KnowledgeEntry.objects.filter(kind=KnowledgeEntry.Kind.SCHEMA, datasource_id__in=datasource_ids)
        .exclude(pk__in=list(known))
        .alias(title_lower=Lower("title"))
        .filter(query)
        .defer("vector")[: 4 * len(names)]
    )


def _lend_to_neighbours(
    scores: dict[int, float], tables: dict[int, KnowledgeEntry], datasource_ids: list[int]
) -> None:
    """Add to ``scores`` (and ``tables``) :data:`NEIGHBOUR_SHARE` of each scored table's
    score for every table a foreign key of its entry's text references, and for every
    scored table whose foreign key references it (one step, from the scores before)."""
    before = dict(scores)
    links: list[tuple[int, int, str]] = []
    for entry_id in before:
        entry = tables[entry_id]
        for target in {m.lower().replace('"', "") for m in _REFERENCE.findall(entry.text)}:
            links.append((entry_id, entry.datasource_id, target))
    found = _schema_named(
        datasource_ids, {(ds, target) for _, ds, target in links}, known=tables
    )
    for entry in found:
        tables[entry.pk] = entry
    by_name = _name_index(tables.values())
    for source_id, datasource_id, target in links:
        for target_id in by_name.get((datasource_id, target), ())[:1]:
            if target_id == source_id:
                continue
            scores[target_id] += NEIGHBOUR_SHARE * before[source_id]
            if target_id in before:
                scores[source_id] += NEIGHBOUR_SHARE * before[target_id]
