"""What PAW knows about a run's datasources, inside the sandbox: the entries it chose for
the prompt, and the index files ``search_knowledge`` queries for more.

A submit op may carry ``knowledge``: ``{"entries": [{"datasource", "kind", "title",
"text", "sql", "verified"?}], "indexes": [{"datasource", "path"}]}`` (paths relative to
the workspace; docs/runtime.md). Each index is an SQLite file PAW wrote (read-only in the
jail): table ``meta`` (``datasource``, ``vector_model`` …), ``entries`` (id, kind, title,
text, sql, vector, verified) and the FTS5 index ``entries_fts``. The runtime never
reaches PAW's database.

A *verified* example (a staff member checked it) is labelled ``[example, verified]``, and
verified examples come first among the examples of a search's results, as among those
PAW chose for the prompt (:func:`verified_examples_first`).

Search is hybrid like PAW's own: FTS5 ``bm25`` over the query's words (OR-ed), merged by
reciprocal rank fusion (k = 60) with cosine similarity of the entries' vectors when the
sandbox was given an embedding endpoint (``PAW_EMBEDDING_BASE_URL``,
``PAW_EMBEDDING_MODEL``, ``PAW_EMBEDDING_API_KEY``) of the index's model.
"""

from __future__ import annotations

import contextlib
import difflib
import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = ("schema", "doc", "example")
CANDIDATES = 50
RRF_K = 60
MAX_LIMIT = 20
ENTRY_CHARS = 6000  # characters of one entry's text shown by search_knowledge
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


class KnowledgeError(ValueError):
    """A ``knowledge`` field of a submit that cannot be used; the message says why."""


@dataclass
class Index:
    """One datasource's index file."""

    datasource: str
    path: Path


@dataclass
class Knowledge:
    """A run's knowledge: the ``entries`` chosen for its prompt and the ``indexes`` to
    search; ``embedding`` is ``(base_url, model, api_key)`` of the query embedder or
    None."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    indexes: list[Index] = field(default_factory=list)
    embedding: tuple[str, str, str] | None = None

    @classmethod
    def from_submit(cls, payload: Any, root: Path, environ: Mapping[str, str]) -> Knowledge:
        """Parse a submit's ``knowledge``; index paths must stay inside ``root`` (the
        workspace). Raises :class:`KnowledgeError` for a malformed payload."""
        if not isinstance(payload, dict):
            raise KnowledgeError("knowledge must be an object")
        entries, indexes = payload.get("entries") or [], payload.get("indexes") or []
        if not isinstance(entries, list) or not isinstance(indexes, list):
            raise KnowledgeError("knowledge.entries and knowledge.indexes must be lists")
        clean = []
        for entry in entries:
            if not isinstance(entry, dict):
                raise KnowledgeError("each knowledge entry must be an object")
            item: dict[str, Any] = {
                key: str(entry.get(key) or "")
                for key in ("datasource", "kind", "title", "text", "sql")
            }
            if entry.get("verified") is True:
                item["verified"] = True
            clean.append(item)
        found = []
        for index in indexes:
            if not isinstance(index, dict) or not isinstance(index.get("path"), str):
                raise KnowledgeError("each knowledge index needs a path")
            path = (root / index["path"]).resolve()
            if root not in path.parents:
                raise KnowledgeError(f"knowledge index {index['path']!r} is outside the workspace")
            found.append(Index(datasource=str(index.get("datasource") or ""), path=path))
        embedding = None
        if environ.get("PAW_EMBEDDING_BASE_URL") and environ.get("PAW_EMBEDDING_MODEL"):
            embedding = (
                environ["PAW_EMBEDDING_BASE_URL"],
                environ["PAW_EMBEDDING_MODEL"],
                environ.get("PAW_EMBEDDING_API_KEY") or "no-key",
            )
        return cls(entries=clean, indexes=found, embedding=embedding)

    @property
    def datasources(self) -> list[str]:
        """The datasources that have an index."""
        return [index.datasource for index in self.indexes]

    def context(self) -> str:
        """The entries chosen for the prompt, as a message for the model ("" when none)."""
        if not self.entries:
            return ""
        lines = [
            "What PAW knows about the datasources, chosen for this request (table "
            "descriptions, operators' notes, example queries; search_knowledge finds more):"
        ]
        if any(entry.get("verified") for entry in self.entries):
            lines[0] += (
                "\nAn example marked verified was checked by a person: when it answers the "
                "question, use its SQL as it is."
            )
        lines += [format_entry(entry) for entry in self.entries]
        return "\n\n".join(lines)

    def search(
        self, query: str, *, datasource: str | None = None, kind: str | None = None, limit: int = 5
    ) -> list[dict[str, Any]]:
        """The entries most relevant to ``query`` (best first, at most ``limit``), of one
        ``datasource`` and one ``kind`` when given. Raises ``sqlite3.Error`` when an index
        cannot be read."""
        words = list(dict.fromkeys(w.lower() for w in _WORD.findall(query) if len(w) > 1))
        scored: list[tuple[float, int, dict[str, Any]]] = []
        for position, index in enumerate(self.indexes):
            if datasource and index.datasource != datasource:
                continue
            for score, entry in self._search_index(index, words, query, kind):
                scored.append((score, position, entry))
        scored.sort(key=lambda item: (-item[0], item[1], item[2]["id"]))
        return verified_examples_first([entry for _, _, entry in scored])[:limit]

    def _search_index(
        self, index: Index, words: list[str], query: str, kind: str | None
    ) -> list[tuple[float, dict[str, Any]]]:
        uri = f"file:{index.path}?mode=ro&immutable=1"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            meta = dict(db.execute("SELECT key, value FROM meta"))
            where, params = ("AND e.kind = ?", [kind]) if kind else ("", [])
            rankings: list[list[int]] = []
            if words:
                match = " OR ".join('"' + word.replace('"', '""') + '"' for word in words)
                sql = (
                    "SELECT e.id FROM entries_fts f JOIN entries e ON e.id = f.rowid "  # noqa: S608
                    f"WHERE entries_fts MATCH ? {where} "
                    "ORDER BY bm25(entries_fts, 4.0, 1.0, 0.5), e.id LIMIT ?"
                )
                ranked = db.execute(sql, [match, *params, CANDIDATES])
                rankings.append([row[0] for row in ranked])
            vector = self._query_vector(query, meta.get("vector_model") or "")
            if vector is not None:
                rankings.append(_by_similarity(db, vector, where, params))
            scores: dict[int, float] = {}
            for ranking in rankings:
                for rank, entry_id in enumerate(ranking):
                    scores[entry_id] = scores.get(entry_id, 0.0) + 1.0 / (RRF_K + rank + 1)
            if not scores:
                return []
            marks = ", ".join("?" for _ in scores)
            columns = {row[1] for row in db.execute("PRAGMA table_info(entries)")}
            # An index written before PAW knew verified examples has no such column.
            verified = "verified" if "verified" in columns else "0"
            rows = db.execute(
                f"SELECT id, kind, title, text, sql, {verified} FROM entries "  # noqa: S608
                f"WHERE id IN ({marks})",
                list(scores),
            )
            return [
                (
                    scores[row[0]],
                    {
                        "id": row[0],
                        "datasource": meta.get("datasource") or index.datasource,
                        "kind": row[1],
                        "title": row[2],
                        "text": row[3],
                        "sql": row[4],
                        "verified": bool(row[5]),
                    },
                )
                for row in rows
            ]

    def schema_entries(
        self, datasource: str, names: list[str], *, similar: bool = True, limit: int = 5
    ) -> tuple[list[dict[str, Any]], list[str]]:
        """The ``schema`` entries of ``datasource`` (its index files, then the run's chosen
        entries) titled by ``names``, the tables a statement names (``orders``,
        ``public.orders``, ``Shop.Orders``): a title matches a name ignoring case, and by
        its last part when one of the two is not qualified (a harvest titles PostgreSQL's
        ``public`` tables without their schema). With ``similar``, a name without an
        entry brings the entries whose titles are closest to it (``difflib``, at most 2
        per name: ``orders`` for ``order``). At most ``limit`` entries, in the order of
        ``names``. Returns ``(entries, the names no entry matched)``; an index that
        cannot be read counts as empty."""
        known: list[dict[str, Any]] = []
        for index in self.indexes:
            if index.datasource != datasource:
                continue
            with contextlib.suppress(sqlite3.Error):
                uri = f"file:{index.path}?mode=ro&immutable=1"
                with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
                    known += [
                        {"id": row[0], "datasource": datasource, "kind": "schema",
                         "title": row[1], "text": row[2], "sql": row[3]}
                        for row in db.execute(
                            "SELECT id, title, text, sql FROM entries WHERE kind = 'schema' "
                            "ORDER BY id"
                        )
                    ]  # fmt: skip
        titles = {str(entry["title"]).lower() for entry in known}
        known += [
            dict(entry)
            for entry in self.entries
            if entry.get("kind") == "schema"
            and entry.get("datasource") == datasource
            and str(entry.get("title")).lower() not in titles
        ]
        chosen: list[dict[str, Any]] = []
        missing: list[str] = []
        for name in names:
            found = [entry for entry in known if _names_table(str(entry["title"]), name)]
            if not found:
                missing.append(name)
                if similar:
                    by_title = {str(entry["title"]).lower(): entry for entry in known}
                    close = difflib.get_close_matches(name.lower(), list(by_title), n=2)
                    found = [by_title[title] for title in close]
            chosen += [entry for entry in found if entry not in chosen]
        return chosen[:limit], missing

    def _query_vector(self, query: str, model: str) -> Any:
        """The query's normalised vector by the index's ``model``, or None (no endpoint,
        another model, or the endpoint failed: full-text alone then)."""
        if self.embedding is None or not model or self.embedding[1] != model:
            return None
        import numpy as np

        from paw_agent.sdk import load_sdk

        sdk = load_sdk()
        base_url, name, api_key = self.embedding
        client = sdk.OpenAI(base_url=base_url, api_key=api_key, timeout=20.0, max_retries=1)
        try:
            # The SDK's generic post, as for chat (paw_agent.model): floats, read as JSON.
            response = client.post(
                "/embeddings",
                body={"model": name, "input": [query], "encoding_format": "float"},
                cast_to=sdk.httpx.Response,
            )
            embedding = response.json()["data"][0]["embedding"]
        except (sdk.OpenAIError, ValueError, LookupError, TypeError):
            return None
        finally:
            client.close()
        vector = np.asarray(embedding, dtype=np.float32)
        norm = float(np.linalg.norm(vector))
        return vector / norm if norm else None


def _by_similarity(db: sqlite3.Connection, vector: Any, where: str, params: list[Any]) -> list[int]:
    """Entry ids of the index by cosine similarity to ``vector`` (stored vectors are
    normalised float32, little-endian), best first."""
    import numpy as np

    rows = [
        (entry_id, np.frombuffer(blob, dtype="<f4"))
        for entry_id, blob in db.execute(
            f"SELECT e.id, e.vector FROM entries e WHERE e.vector IS NOT NULL {where}",  # noqa: S608
            params,
        )
    ]
    rows = [(entry_id, v) for entry_id, v in rows if len(v) == len(vector)]
    if not rows:
        return []
    similarity = np.vstack([v for _, v in rows]) @ vector
    order = np.argsort(-similarity, kind="stable")[:CANDIDATES]
    return [rows[i][0] for i in order]


def verified_examples_first(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` (best first) with the examples among them reordered, verified ones
    first (each group in its order); the places of the other kinds are kept. PAW's
    ``secrets_vault.context.verified_examples_first`` is the same rule (on examples alone)."""
    examples = iter(
        sorted(
            (e for e in entries if e.get("kind") == "example"),
            key=lambda e: not e.get("verified"),
        )
    )
    return [next(examples) if e.get("kind") == "example" else e for e in entries]


def _names_table(title: str, name: str) -> bool:
    """Whether a schema entry's ``title`` is the table a statement calls ``name``: the
    same ignoring case and quotes, or the same last part when one of them is not
    qualified (``orders`` and ``public.orders``)."""
    title, name = title.replace('"', "").lower(), name.replace('"', "").lower()
    if title == name:
        return True
    if "." in title and "." in name:
        return False
    return title.rsplit(".", 1)[-1] == name.rsplit(".", 1)[-1]


def format_entry(entry: Mapping[str, Any], *, limit: int = ENTRY_CHARS) -> str:
    """One entry for the model: ``[kind] title (datasource)`` (``[example, verified]``
    for a verified example), its text, and an example's SQL in a fenced block."""
    text = str(entry.get("text") or "")
    if len(text) > limit:
        text = text[:limit] + " …"
    kind = f"{entry.get('kind')}, verified" if entry.get("verified") else entry.get("kind")
    parts = [f"[{kind}] {entry.get('title')} (datasource {entry.get('datasource')})"]
    if text:
        parts.append(text)
    if entry.get("sql"):
        parts.append(f"```sql\n{entry['sql']}\n```")
    return "\n".join(parts)
