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
2. Tables are scored from four kinds of evidence, each by reciprocal rank (k = 60, as
   the search's own fusion): the schema entries found for the prompt; the schema entries
   found for the prompt *expanded* by the best docs' and examples' words (pseudo-relevance
   feedback: Rocchio, 1971; Lavrenko and Croft, 2001); the tables the best examples' SQL
   reads (``paw_sqlcheck.references``: a related question's query names them exactly);
   the tables whose columns the best docs name (``Currency = 'EUR'``, ``drivers.dob``:
   :func:`_linked`). Then each scored table lends a share of its score to the tables its
   foreign keys join it to, both ways (the join path a question needs; schema linking as
   in Wang et al., RAT-SQL, 2020). Names, columns and foreign keys come from a
   :class:`SchemaMap` of the schema entries, kept per process and knowledge version.
3. The budget is packed: the best docs up to :data:`DOC_SHARE` of it, the best examples up
   to :data:`EXAMPLE_SHARE` (verified ones first: :func:`verified_examples_first`), the
   tables scored at least :data:`STRONG` of the best one's, then the next best of each
   kind in turn while anything fits. Entries with the same text are given once.
"""

from __future__ import annotations

import collections
import functools
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from paw_sqlcheck.references import statement_references
from secrets_vault.models import Datasource, KnowledgeEntry
from secrets_vault.selectors import RRF_K, knowledge_search, knowledge_versions, query_words

#: Shares of the budget the best docs and the best examples may take before the tables.
DOC_SHARE = 0.3
EXAMPLE_SHARE = 0.25
#: Entries searched per kind, and how many of the best docs and examples feed the
#: expanded query and the tables of step 2.
SEARCHED = 30
FEEDBACK_DOCS = 3
FEEDBACK_EXAMPLES = 5
#: Weights of the table evidence of step 2 (the prompt's own schema search is 1).
EXPANDED_WEIGHT = 1.0
EXAMPLE_WEIGHT = 2.0
#: Weight of a table a top doc names (by a column or as ``table.column``).
DOC_LINK_WEIGHT = 1.0
#: Share of a table's score lent to each table a foreign key joins it to.
NEIGHBOUR_SHARE = 0.5
#: Tables scored at least this share of the best one's are packed before the rest.
STRONG = 0.25
#: Words of the expanded query, at most.
EXPANDED_WORDS = 48
#: Docs searched (they are short: more of them fit).
SEARCHED_DOCS = 50

_REFERENCE = re.compile(r"references ([^\s(]+)\(", re.IGNORECASE)


#: Examples' parsed tables kept per process (an example's SQL rarely changes).
PARSED_CACHE_SIZE = 4096


@functools.lru_cache(maxsize=PARSED_CACHE_SIZE)
def _tables_read(sql: str, dialect: str) -> frozenset[str]:
    """The tables an example's SQL reads (lower case, as written: ``schema.table`` or
    ``table``; ``paw_sqlcheck.references``, CTEs and subqueries followed to their base
    tables), kept per process; empty when it does not parse."""
    return frozenset(_unquoted(name) for name in statement_references(sql, dialect=dialect).tables)


def _unquoted(name: str) -> str:
    """A name lower-cased, without its quotes (``"Cards"`` → ``cards``)."""
    return name.lower().replace('"', "").replace("`", "")


def _name_keys(title: str) -> set[str]:
    """The names SQL may give a schema entry's table: its title lower-cased, without
    quotes, and its bare name when qualified (``formula_1.races`` → also ``races``)."""
    name = _unquoted(title)
    return {name, name.rsplit(".", 1)[-1]}


@dataclass
class SchemaMap:
    """The tables of some datasources as their schema entries describe them, for linking
    names to tables without a query: ``names`` (``(datasource id, name as SQL may write
    it)`` → entry ids), ``columns`` (a column line's first word → entry ids),
    ``lines`` (entry id → its column lines, lower case, without the ``- ``),
    ``references`` (entry id → the names its foreign keys reference) and ``referenced``
    (``(datasource id, name)`` → the entries referencing it); ``datasource_of`` and
    ``keys`` (the names of :func:`_name_keys`) per entry id."""

    names: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    columns: dict[str, list[int]] = field(default_factory=dict)
    lines: dict[int, list[str]] = field(default_factory=dict)
    references: dict[int, set[str]] = field(default_factory=dict)
    referenced: dict[tuple[int, str], list[int]] = field(default_factory=dict)
    datasource_of: dict[int, int] = field(default_factory=dict)
    keys: dict[int, set[str]] = field(default_factory=dict)

    def named(self, datasource_id: int, name: str) -> list[int]:
        """The entries SQL's ``name`` (lower case) may mean in the datasource."""
        return self.names.get((datasource_id, name), [])

    def with_column(self, column: str) -> list[int]:
        """The entries with a column named ``column`` (lower case; may hold spaces)."""
        first = column.split(" ", 1)[0]
        return [
            entry_id
            for entry_id in self.columns.get(first, ())
            if any(line == column or line.startswith(column + " ") for line in self.lines[entry_id])
        ]


#: Sets of datasources whose schema map a process keeps.
SCHEMA_CACHE_SIZE = 8


def schema_map(datasource_ids: list[int]) -> SchemaMap:
    """The :class:`SchemaMap` of the datasources' schema entries, cached per process
    while no datasource's ``knowledge_version`` changed (one query for the versions; the
    entries' texts, streamed, when it did)."""
    return _schema_map_of(knowledge_versions(datasource_ids))


@functools.lru_cache(maxsize=SCHEMA_CACHE_SIZE)
def _schema_map_of(versions: tuple[tuple[int, int], ...]) -> SchemaMap:
    """The schema map of the datasources of ``versions`` (``(id, knowledge_version)``
    pairs: a new version is a new key)."""
    datasource_ids = [pk for pk, _ in versions]
    built = SchemaMap()
    names: dict[tuple[int, str], list[int]] = collections.defaultdict(list)
    columns: dict[str, list[int]] = collections.defaultdict(list)
    referenced: dict[tuple[int, str], list[int]] = collections.defaultdict(list)
    rows = KnowledgeEntry.objects.filter(
        datasource_id__in=datasource_ids, kind=KnowledgeEntry.Kind.SCHEMA, flag_reason=""
    ).values_list("id", "datasource_id", "title", "text")
    for entry_id, datasource_id, title, text in rows.iterator(chunk_size=500):
        built.datasource_of[entry_id] = datasource_id
        built.keys[entry_id] = _name_keys(title)
        for key in built.keys[entry_id]:
            names[(datasource_id, key)].append(entry_id)
        lines = [line[2:].lower() for line in text.splitlines() if line.startswith("- ")]
        built.lines[entry_id] = lines
        for first in {line.split(" ", 1)[0] for line in lines}:
            columns[first].append(entry_id)
        targets = {_unquoted(m) for m in _REFERENCE.findall(text)}
        built.references[entry_id] = targets
        for target in targets:
            referenced[(datasource_id, target)].append(entry_id)
    built.names, built.columns, built.referenced = dict(names), dict(columns), dict(referenced)
    return built


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
    Flagged entries (``flag_reason``) are never chosen; of entries with the same text
    (and SQL) one is. ``query_vector`` (normalised, by ``vector_model``) adds the vector
    ranking to each search."""
    ids = [d.pk for d in datasources]
    dialects = {d.pk: d.dialect for d in datasources}

    def search(
        query: str, kind: str, vector: bool = True, limit: int = SEARCHED
    ) -> list[KnowledgeEntry]:
        hits = knowledge_search(
            datasource_ids=ids,
            query=query,
            limit=limit,
            query_vector=query_vector if vector else None,
            vector_model=vector_model if vector else "",
            kinds=(kind,),
        )
        # Kept from runs: flagged until an operator acts, stale until its SQL passes again.
        return [
            hit.entry for hit in hits if not hit.entry.flag_reason and hit.entry.stale_since is None
        ]

    docs = search(prompt, KnowledgeEntry.Kind.DOC, limit=SEARCHED_DOCS)
    examples = search(prompt, KnowledgeEntry.Kind.EXAMPLE)
    schema = search(prompt, KnowledgeEntry.Kind.SCHEMA)
    feedback = [prompt]
    feedback += [f"{d.title} {d.text}" for d in docs[:FEEDBACK_DOCS]]
    feedback += [f"{e.title} {e.sql}" for e in examples[:FEEDBACK_EXAMPLES]]
    expanded_words = query_words(" ".join(feedback))[:EXPANDED_WORDS]
    expanded = search(" ".join(expanded_words), KnowledgeEntry.Kind.SCHEMA, False)

    tables = schema_map(ids)
    scores: dict[int, float] = collections.defaultdict(float)
    loaded: dict[int, KnowledgeEntry] = {}
    for weight, ranking in ((1.0, schema), (EXPANDED_WEIGHT, expanded)):
        for rank, entry in enumerate(ranking):
            scores[entry.pk] += weight / (RRF_K + rank + 1)
            loaded[entry.pk] = entry
    for rank, example in enumerate(examples[:FEEDBACK_EXAMPLES]):
        for name in _tables_read(example.sql, dialects[example.datasource_id]):
            for entry_id in tables.named(example.datasource_id, name):
                scores[entry_id] += EXAMPLE_WEIGHT / (RRF_K + rank + 1)
    links = {doc.pk: _linked(doc, tables) for doc in docs}
    for rank, doc in enumerate(docs[:FEEDBACK_DOCS]):
        weight = DOC_LINK_WEIGHT / (RRF_K + rank + 1)
        for entry_id, times in links[doc.pk].items():
            scores[entry_id] += weight * times
    _lend_to_neighbours(scores, tables)

    ranked_ids = sorted(scores, key=lambda i: (-scores[i], i))[:MAX_TABLES]
    missing = [i for i in ranked_ids if i not in loaded]
    if missing:
        loaded.update(KnowledgeEntry.objects.defer("vector").in_bulk(missing))
    ranked = [loaded[i] for i in ranked_ids if i in loaded and not loaded[i].flag_reason]

    chosen: list[KnowledgeEntry] = []
    seen: set[tuple[int, str, str, str]] = set()
    left = budget

    def take(entry: KnowledgeEntry, within: float) -> float:
        nonlocal left
        key = (entry.datasource_id, entry.kind, entry.text.strip(), entry.sql.strip())
        if key in seen:  # the same note twice on a datasource (or one already chosen)
            return within
        price = cost(entry)
        if price > left or price > within:
            return within
        chosen.append(entry)
        seen.add(key)
        left -= price
        return within - price

    share = budget * DOC_SHARE
    for entry in docs:
        share = take(entry, share)
    share = budget * EXAMPLE_SHARE
    examples_packed = verified_examples_first(examples)
    for entry in examples_packed:
        share = take(entry, share)
    top = scores[ranked[0].pk] if ranked else 0.0
    strong = [entry for entry in ranked if scores[entry.pk] >= STRONG * top]
    for entry in strong:
        take(entry, math.inf)
    # What is left goes to the next best of each kind in turn (the weaker tables too).
    rest = [iter(docs), iter(ranked[len(strong) :]), iter(examples_packed), iter(schema)]
    while rest and left > 0:
        for queue in list(rest):
            entry = next(queue, None)
            if entry is None:
                rest.remove(queue)
            else:
                take(entry, math.inf)
    order = {
        KnowledgeEntry.Kind.SCHEMA: 0,
        KnowledgeEntry.Kind.DOC: 1,
        KnowledgeEntry.Kind.EXAMPLE: 2,
    }
    return sorted(chosen, key=lambda entry: order.get(entry.kind, 3))  # stable: by relevance


def verified_examples_first(examples: list[KnowledgeEntry]) -> list[KnowledgeEntry]:
    """``examples`` (most relevant first) with the verified ones first, each group in its
    order (a staff member checked them: docs/data.md, "Verified examples"). paw-agent's
    ``search_knowledge`` orders its results by the same rule."""
    return sorted(examples, key=lambda entry: entry.verified_at is None)


#: Tables scored, at most, of which the best are loaded to be packed.
MAX_TABLES = 200
#: Words of a doc that name a column: ``a_b``, ``t.c``, ``camelCase``, in backticks, or
#: before a comparison (``Currency = 'EUR'``) or inside a call (``MIN(year(dob))``).
_IDENTIFIER = re.compile(
    r"`([^`\n]{1,64})`"
    r"|\b([A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*)\b"
    r"|\b([A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]*|[a-z]+[A-Z][A-Za-z0-9]*)\b"
    r"|\b([A-Za-z_][A-Za-z0-9_]*)\s*(?:=|<|>|!=|\bLIKE\b|\bIN\b|\bBETWEEN\b|\bIS\b)"
    r"|\(\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)",
    re.IGNORECASE,
)


def _linked(doc: KnowledgeEntry, tables: SchemaMap) -> dict[int, int]:
    """The schema entries a doc names (see :data:`_IDENTIFIER`), each with a weight: 2 for
    a table its ``table.column`` names, 1 for a table with a column of a name it uses."""
    found: dict[int, int] = collections.defaultdict(int)
    names = {
        next(g for g in m.groups() if g).strip().lower() for m in _IDENTIFIER.finditer(doc.text)
    }
    for name in names:
        table, _, column = name.rpartition(".")
        candidates = tables.with_column(column)
        if table:
            named = set(tables.named(doc.datasource_id, table))
            for entry_id in candidates:
                if entry_id in named:
                    found[entry_id] = max(found[entry_id], 2)
        elif len(candidates) <= COMMON_COLUMN:
            for entry_id in candidates:
                if tables.datasource_of.get(entry_id) == doc.datasource_id:
                    found[entry_id] = max(found[entry_id], 1)
    return found


#: A column name more tables than this have (``id``, ``name``) says nothing of which.
COMMON_COLUMN = 20


def _lend_to_neighbours(scores: dict[int, float], tables: SchemaMap) -> None:
    """Add to ``scores`` :data:`NEIGHBOUR_SHARE` of each scored table's score for every
    table its foreign keys reference and every table whose foreign keys reference it
    (one step, from the scores before)."""
    before = dict(scores)
    for entry_id, score in before.items():
        datasource_id = tables.datasource_of.get(entry_id)
        if datasource_id is None:
            continue
        neighbours: set[int] = set()
        for target in tables.references.get(entry_id, ()):
            neighbours.update(tables.named(datasource_id, target)[:1])
        for key in tables.keys.get(entry_id, ()):
            neighbours.update(tables.referenced.get((datasource_id, key), ()))
        for neighbour in neighbours - {entry_id}:
            scores[neighbour] += NEIGHBOUR_SHARE * score
