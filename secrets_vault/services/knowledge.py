"""Writes of datasource knowledge: entries (docs, examples, harvested schema), their
vectors, the schema refresh, and what a run on a datasource is given.

Every change of a datasource's knowledge bumps its ``knowledge_version`` in the same
transaction, so caches keyed on it (the vector matrix of ``selectors``, the sandbox's
index file) never serve a stale state.

What a run gets (:func:`knowledge_for_run`, on the worker): the entries most relevant to
its prompt within ``PAW_KNOWLEDGE_CONTEXT_TOKENS``, and per datasource an SQLite index
file (FTS5 and, with embeddings, the vectors: :func:`knowledge_index_write`) that the node
puts read-only into the sandbox for paw-agent's ``search_knowledge`` tool: the runtime
never reaches PAW's database (docs/runtime.md, "Datasource knowledge in the sandbox").
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.db import DatabaseError, transaction
from django.db.models import F
from django.utils import timezone

from paw_project.errors import DomainError, InvalidRequest
from secrets_vault import enqueue
from secrets_vault.connections import ConnectionFailed, NotARead, driver_message, query_check
from secrets_vault.context import context_select
from secrets_vault.embeddings import (
    Embedder,
    EmbeddingError,
    LocalEmbedder,
    embedder_configured,
)
from secrets_vault.introspection import ValueSampling, schema_harvest
from secrets_vault.masking import mask_text
from secrets_vault.models import Datasource, KnowledgeEntry
from secrets_vault.schema_changes import schema_diff, schema_structure
from secrets_vault.selectors import datasources_for_user, knowledge_unembedded
from secrets_vault.services.datasources import datasource_resolved
from secrets_vault.vectors import vector_bytes

if TYPE_CHECKING:
    from accounts.models import User

logger = logging.getLogger(__name__)

#: Seconds an example's query may run when it is checked, and each statement of a
#: schema harvest.
EXAMPLE_TIMEOUT = 10.0
SCHEMA_TIMEOUT = 30.0
#: Seconds after a schema refresh began (the harvest included) past which it starts no
#: more re-checks of its examples (each within :data:`EXAMPLE_TIMEOUT`): the refresh is a
#: worker task within ``PAW_TASK_SOFT_TIME_LIMIT`` (60 s by default). Examples not reached
#: wait for the next refresh, which takes the least recently checked first.
RECHECK_BUDGET_SECONDS = 25.0
#: Schema entries written per INSERT of a refresh.
SCHEMA_WRITE_BATCH = 500
#: Longest title and text of an entry (characters).
MAX_TITLE = 300
MAX_TEXT = 50_000
#: Entries embedded per call of :func:`knowledge_embed_missing`.
EMBED_BATCH = 256
#: Characters per token, as paw-agent estimates them (its ``model.estimate_tokens``).
CHARS_PER_TOKEN = 3.5
EDITABLE_KINDS = (KnowledgeEntry.Kind.DOC, KnowledgeEntry.Kind.EXAMPLE)


def _version_bump(datasource_id: int) -> None:
    Datasource.objects.filter(pk=datasource_id).update(knowledge_version=F("knowledge_version") + 1)


def _fields_check(*, kind: str, title: str, text: str, sql: str) -> None:
    if kind == KnowledgeEntry.Kind.SCHEMA:
        raise InvalidRequest(
            "Schema entries are harvested from the database: refresh the schema "
            "(POST .../refresh-schema, or the admin's action) instead of writing them.",
            code="schema_is_harvested",
        )
    if kind not in EDITABLE_KINDS:
        raise InvalidRequest("kind is one of schema, doc, example.", code="invalid_kind")
    if not title.strip():
        raise InvalidRequest("An entry needs a title.", code="title_required")
    if len(title) > MAX_TITLE or len(text) > MAX_TEXT or len(sql) > MAX_TEXT:
        raise InvalidRequest(
            f"A title is at most {MAX_TITLE} characters, a text and an SQL statement at most "
            f"{MAX_TEXT}.",
            code="too_long",
        )
    if kind == KnowledgeEntry.Kind.EXAMPLE and not sql.strip():
        raise InvalidRequest("An example needs the SQL that answers it.", code="sql_required")
    if kind == KnowledgeEntry.Kind.DOC and sql.strip():
        raise InvalidRequest(
            "Only examples have SQL; write it in the doc's text.", code="sql_not_allowed"
        )
    if kind == KnowledgeEntry.Kind.DOC and not text.strip():
        raise InvalidRequest("A doc needs a text.", code="text_required")


def knowledge_example_check(*, datasource: Datasource, sql: str, user: User | None) -> None:
    """Run an example's ``sql`` read-only on the datasource (placeholders resolved for
    ``user``), within :data:`EXAMPLE_TIMEOUT` seconds, and roll back.

    Raises :class:`InvalidRequest` ``example_not_a_read`` (nothing sent to the database)
    when ``sql`` is not one read by ``run_sql``'s rule (``paw_sqlcheck.judge`` for the
    datasource's dialect: a write, ``INTO OUTFILE``, ``COPY``, ``ATTACH``, a function off
    the allow-list...; ``extra["check"]`` is the verdict's code); ``example_failed``
    with the database's own error (secret values masked) when it cannot connect, refuses
    the statement (the transaction is read-only), times out or returns no rows to look
    at; as ``datasource_resolve`` for the connection.
    """
    connection, masked = datasource_resolved(datasource=datasource, user=user)
    _example_run(datasource=datasource, connection=connection, masked=masked, sql=sql)


def _example_run(
    *, datasource: Datasource, connection: dict[str, Any], masked: dict[str, str], sql: str
) -> None:
    """:func:`knowledge_example_check` on *resolved* ``connection`` settings (``masked``:
    the secret values to mask in an error)."""
    try:
        query_check(
            dialect=datasource.dialect, connection=connection, sql=sql, timeout=EXAMPLE_TIMEOUT
        )
    except NotARead as refused:
        raise InvalidRequest(
            f"The example's SQL was not run on {datasource.slug}: {refused}",
            code="example_not_a_read",
            extra={"check": refused.code},
        ) from None
    except ConnectionFailed as failure:
        message = mask_text(str(failure), masked)
        raise InvalidRequest(
            f"The example's SQL failed on {datasource.slug}: {message}",
            code="example_failed",
            extra={"error": message},
        ) from None


def knowledge_entry_validate(
    *,
    datasource: Datasource,
    kind: str,
    title: str,
    text: str,
    sql: str,
    user: User | None,
    run_sql: bool = True,
) -> None:
    """Every rule an entry written by a person must pass (see
    :func:`knowledge_entry_create`); the admin's form calls it before saving.
    ``run_sql=False`` skips running an example's SQL (unchanged since it was checked)."""
    _fields_check(kind=kind, title=title, text=text, sql=sql)
    if kind == KnowledgeEntry.Kind.EXAMPLE and run_sql:
        knowledge_example_check(datasource=datasource, sql=sql, user=user)


def knowledge_entry_create(
    *,
    datasource: Datasource,
    kind: str,
    title: str,
    text: str = "",
    sql: str = "",
    user: User | None,
    checked: bool = False,
) -> KnowledgeEntry:
    """Add a ``doc`` (``title`` and Markdown ``text``) or an ``example`` (a question in
    ``title``, optional notes in ``text``, the ``sql`` answering it) to the datasource.

    An example's SQL is run read-only first (:func:`knowledge_example_check`) unless
    ``checked`` says the caller just did. Raises :class:`InvalidRequest`:
    ``schema_is_harvested`` (schema entries come from a refresh), ``invalid_kind``,
    ``title_required``, ``text_required``, ``sql_required``, ``sql_not_allowed``,
    ``too_long``, ``example_failed`` (with the database's error). Its vector is made on
    the worker after commit when embeddings are configured.
    """
    if checked:
        _fields_check(kind=kind, title=title, text=text, sql=sql)
    else:
        knowledge_entry_validate(
            datasource=datasource, kind=kind, title=title, text=text, sql=sql, user=user
        )
    now = timezone.now()
    with transaction.atomic():
        entry = KnowledgeEntry.objects.create(
            datasource=datasource,
            kind=kind,
            title=title.strip(),
            text=text,
            sql=sql.strip(),
            checked_at=now if kind == KnowledgeEntry.Kind.EXAMPLE else None,
            created_at=now,
            updated_at=now,
        )
        _version_bump(datasource.pk)
        _embed_later(datasource.pk)
    logger.info("datasource %s: %s entry %s added", datasource.slug, kind, entry.pk)
    return entry


def knowledge_entry_update(
    *, entry: KnowledgeEntry, user: User | None, checked: bool = False, **fields: Any
) -> KnowledgeEntry:
    """Change ``title``, ``text`` or ``sql`` of a doc or an example (same rules as
    :func:`knowledge_entry_create`; a changed SQL is checked again, and so is the SQL of a
    stale example, changed or not: passing clears ``stale_error``/``stale_since``; a
    changed SQL clears the example's verification: :func:`knowledge_entry_verify`).
    Schema entries are the database's: refused with ``schema_is_harvested``.
    ``TypeError`` for other fields (a programming error)."""
    unknown = set(fields) - {"title", "text", "sql"}
    if unknown:
        raise TypeError(f"not updatable: {sorted(unknown)}")
    values = {"title": entry.title, "text": entry.text, "sql": entry.sql, **fields}
    _fields_check(kind=entry.kind, **values)
    example = entry.kind == KnowledgeEntry.Kind.EXAMPLE
    run_sql = example and (values["sql"] != entry.sql or entry.stale_since is not None)
    if run_sql and not checked:
        knowledge_example_check(datasource=entry.datasource, sql=values["sql"], user=user)
    with transaction.atomic():
        if values["sql"].strip() != entry.sql:
            entry.flag_reason = ""  # its new SQL passed the check (here or by the caller)
            # What was verified is the old SQL: the new one must be verified again.
            entry.verified_by, entry.verified_at, entry.verified_version = None, None, None
        if run_sql:  # it passed (here or by the caller)
            entry.stale_error, entry.stale_since = "", None
            entry.checked_at = timezone.now()
        entry.title = values["title"].strip()
        entry.text = values["text"]
        entry.sql = values["sql"].strip()
        entry.vector, entry.vector_model = None, ""
        entry.updated_at = timezone.now()
        entry.save()
        _version_bump(entry.datasource_id)
        _embed_later(entry.datasource_id)
    return entry


def knowledge_entry_verify(*, entry: KnowledgeEntry, user: User) -> KnowledgeEntry:
    """Mark the example ``entry`` verified by ``user`` (staff: the edges check), now,
    against its datasource's current ``knowledge_version`` (the knowledge the staff member
    saw; verifying bumps it, as every change does). Verifying again renews all three.
    Verified examples come first among the examples a run is given, and an answer with
    the same SQL (parsed) is a verified query (``selectors.verified_example_matching``).

    Raises :class:`InvalidRequest` ``not_an_example`` for a schema entry or a doc,
    ``example_flagged`` for an example kept from runs (its ``flag_reason``: fix its SQL
    first); nothing is changed then."""
    if entry.kind != KnowledgeEntry.Kind.EXAMPLE:
        raise InvalidRequest(
            f"Only examples can be verified; this entry is a {entry.kind}.",
            code="not_an_example",
        )
    if entry.flag_reason:
        raise InvalidRequest(
            f"This example is kept from runs ({entry.flag_reason}): fix its SQL before "
            "verifying it.",
            code="example_flagged",
        )
    with transaction.atomic():
        version = (
            Datasource.objects.select_for_update()
            .filter(pk=entry.datasource_id)
            .values_list("knowledge_version", flat=True)
            .get()
        )
        entry.verified_by, entry.verified_at, entry.verified_version = user, timezone.now(), version
        entry.save(update_fields=["verified_by", "verified_at", "verified_version"])
        _version_bump(entry.datasource_id)
    logger.info("datasource %s: example %s verified", entry.datasource_id, entry.pk)
    return entry


def knowledge_entry_unverify(*, entry: KnowledgeEntry) -> KnowledgeEntry:
    """Clear an example's verification (nothing to do when it has none). Raises
    :class:`InvalidRequest` ``not_an_example`` for a schema entry or a doc."""
    if entry.kind != KnowledgeEntry.Kind.EXAMPLE:
        raise InvalidRequest(
            f"Only examples can be verified; this entry is a {entry.kind}.",
            code="not_an_example",
        )
    if entry.verified_at is None:
        return entry
    with transaction.atomic():
        entry.verified_by, entry.verified_at, entry.verified_version = None, None, None
        entry.save(update_fields=["verified_by", "verified_at", "verified_version"])
        _version_bump(entry.datasource_id)
    logger.info("datasource %s: example %s no longer verified", entry.datasource_id, entry.pk)
    return entry


def knowledge_entry_delete(*, entry: KnowledgeEntry) -> None:
    """Delete an entry (a schema entry too: it comes back with the next refresh)."""
    with transaction.atomic():
        entry.delete()
        _version_bump(entry.datasource_id)


def _embed_later(datasource_id: int) -> None:
    if settings.PAW_EMBEDDING_PROVIDER:
        transaction.on_commit(lambda: enqueue.knowledge_embed_enqueue(datasource_id=datasource_id))


# --- The schema refresh ------------------------------------------------------------------


def datasource_schema_refresh_request(*, datasource: Datasource, user: User | None) -> Datasource:
    """Ask a worker to harvest the datasource's live schema (placeholders resolved there
    for ``user``, the operator who asked: their own secret first). Notes the time asked;
    the entries change when the worker is done (:func:`datasource_schema_refresh`)."""
    with transaction.atomic():
        datasource.schema_requested_at = timezone.now()
        Datasource.objects.filter(pk=datasource.pk).update(
            schema_requested_at=datasource.schema_requested_at
        )
        transaction.on_commit(
            lambda: enqueue.schema_refresh_enqueue(
                datasource_id=datasource.pk, user_id=user.pk if user is not None else None
            )
        )
    logger.info("datasource %s: schema refresh requested", datasource.slug)
    return datasource


def datasource_schema_refresh(*, datasource_id: int, user: User | None) -> int | None:
    """On the worker: read the datasource's tables and views from its live database
    (read-only, each statement within :data:`SCHEMA_TIMEOUT` seconds) and replace its
    schema entries with one per table, in one transaction (:data:`SCHEMA_WRITE_BATCH`
    entries per statement); then run its examples again (:func:`knowledge_examples_recheck`,
    after that transaction: none is held open while they run). Returns how many tables,
    or None when it failed: the failure (the database's error, secret values masked) is
    recorded in ``schema_error`` and the previous entries stay. A datasource deleted
    meanwhile is left alone (None). Values of text columns are sampled when its operator
    allows it (:func:`schema_value_sampling`); how far the harvest got is kept in
    ``schema_progress`` as it goes.

    What changed since the previous harvest is recorded in ``schema_changes``
    (``schema_changes.schema_diff``'s dict, plus ``"at"``, the refresh's time in ISO 8601,
    and ``"examples"``, the re-check's summary), from the structure kept in
    ``schema_tables``; the first harvest (none kept) has ``first_harvest`` true and every
    table added.
    """
    datasource = Datasource.objects.defer("schema_tables").filter(pk=datasource_id).first()
    if datasource is None:
        return None
    started = time.monotonic()
    masked: dict[str, str] = {}
    try:
        connection, masked = datasource_resolved(datasource=datasource, user=user)
        tables = schema_harvest(
            dialect=datasource.dialect,
            connection=connection,
            timeout=SCHEMA_TIMEOUT,
            values=schema_value_sampling(datasource=datasource, secret_values=masked),
            progress=_schema_progress_recorder(datasource_id),
        )
    except DomainError as error:
        return _schema_failed(datasource, error.detail)
    except Exception as exc:  # any driver failure is the operator's answer
        return _schema_failed(datasource, mask_text(driver_message(exc), masked))
    now = timezone.now()
    structure = schema_structure(tables)
    with transaction.atomic():
        locked = Datasource.objects.select_for_update().filter(pk=datasource_id).first()
        if locked is None:
            return None
        changes = {"at": now.isoformat(), **schema_diff(locked.schema_tables, structure)}
        KnowledgeEntry.objects.filter(datasource=locked, kind=KnowledgeEntry.Kind.SCHEMA).delete()
        KnowledgeEntry.objects.bulk_create(
            (
                KnowledgeEntry(
                    datasource=locked,
                    kind=KnowledgeEntry.Kind.SCHEMA,
                    title=table.entry_title()[:MAX_TITLE],
                    text=table.entry_text()[:MAX_TEXT],
                    created_at=now,
                    updated_at=now,
                )
                for table in tables
            ),
            batch_size=SCHEMA_WRITE_BATCH,
        )
        Datasource.objects.filter(pk=datasource_id).update(
            schema_refreshed_at=now,
            schema_error="",
            schema_tables=structure,
            schema_changes=changes,
            knowledge_version=F("knowledge_version") + 1,
        )
        _embed_later(datasource_id)
    logger.info("datasource %s: schema refreshed, %d tables", datasource.slug, len(tables))
    summary = knowledge_examples_recheck(
        datasource=datasource,
        connection=connection,
        masked=masked,
        since=now,
        deadline=started + RECHECK_BUDGET_SECONDS,
    )
    # Only onto this refresh's record: a later refresh writes its own.
    Datasource.objects.filter(pk=datasource_id, schema_refreshed_at=now).update(
        schema_changes={**changes, "examples": summary}
    )
    return len(tables)


def knowledge_examples_recheck(
    *,
    datasource: Datasource,
    connection: dict[str, Any],
    masked: dict[str, str],
    since: datetime,
    deadline: float,
) -> dict[str, int]:
    """Run the datasource's examples again, read-only, each within :data:`EXAMPLE_TIMEOUT`
    seconds, on *resolved* ``connection`` settings (``masked``: secret values to mask),
    the least recently checked first, until the ``time.monotonic()`` ``deadline``; each
    result is stored on its own (no transaction spans the queries).

    One that fails (the database refuses it, it times out, or it is no longer a read by
    the current rule) becomes *stale*: ``stale_error`` holds the database's error (masked),
    ``stale_since`` when it first failed (kept while it keeps failing); one that passes is
    not stale. A result is dropped when the example's SQL changed meanwhile. Examples
    checked at or after ``since`` are not run again, nor flagged ones (``flag_reason``:
    not a read by the current rule, never sent to the database). Bumps
    ``knowledge_version`` when a stale state changed.

    Returns ``{"checked", "stale", "unstaled", "pending"}``: examples run now, of them
    those found failing and those that passed after being stale, and those the deadline
    left for the next refresh.
    """
    examples = (
        KnowledgeEntry.objects.filter(
            datasource=datasource, kind=KnowledgeEntry.Kind.EXAMPLE, flag_reason=""
        )
        .exclude(checked_at__gte=since)
        .order_by(F("checked_at").asc(nulls_first=True), "id")
        .values_list("id", "sql", "stale_since")
    )
    todo = list(examples)
    summary = {"checked": 0, "stale": 0, "unstaled": 0, "pending": 0}
    for position, (entry_id, sql, stale_since) in enumerate(todo):
        if time.monotonic() >= deadline:
            summary["pending"] = len(todo) - position
            break
        try:
            _example_run(datasource=datasource, connection=connection, masked=masked, sql=sql)
            error = ""
        except InvalidRequest as failed:
            error = str(failed.extra.get("error") or failed.detail)[:5000]
        checked = timezone.now()
        update: dict[str, Any] = {"checked_at": checked, "stale_error": error}
        if error:
            update["stale_since"] = stale_since or checked
        else:
            update["stale_since"] = None
        changed = bool(error) != (stale_since is not None)
        with transaction.atomic():
            # Not when its SQL was changed meanwhile (that save checked the new SQL).
            done = KnowledgeEntry.objects.filter(pk=entry_id, sql=sql).update(**update)
            if done and changed:
                _version_bump(datasource.pk)
        summary["checked"] += 1
        if error:
            summary["stale"] += 1
        elif stale_since is not None:
            summary["unstaled"] += 1
    if summary["stale"] or summary["unstaled"]:
        logger.info(
            "datasource %s: examples re-checked: %d stale, %d no longer stale",
            datasource.slug,
            summary["stale"],
            summary["unstaled"],
        )
    return summary


def _schema_failed(datasource: Datasource, message: str) -> None:
    text = f"Schema refresh failed: {message}"[:5000]
    Datasource.objects.filter(pk=datasource.pk).update(schema_error=text, schema_progress="")
    logger.info("datasource %s: schema refresh failed", datasource.slug)
    return None


def schema_value_sampling(
    *, datasource: Datasource, secret_values: dict[str, str]
) -> ValueSampling | None:
    """What the datasource's refresh samples of column values: None unless its operator
    allows it (``sample_values``) and ``PAW_KNOWLEDGE_VALUE_SAMPLE`` is above 0; its
    ``sensitive_columns`` are never read, and ``secret_values`` (``NAME → value``, its
    resolved secrets) are masked in what is recorded."""
    limit = settings.PAW_KNOWLEDGE_VALUE_SAMPLE
    if not datasource.sample_values or limit <= 0:
        return None
    return ValueSampling(
        limit=limit,
        sensitive=tuple(datasource.sensitive_columns or ()),
        secret_values=secret_values,
    )


def _schema_progress_recorder(datasource_id: int) -> Callable[[str], None]:
    """Records a harvest's progress on the datasource (``schema_progress``), outside the
    refresh's transaction so that it shows while the refresh runs."""

    def record(text: str) -> None:
        try:
            Datasource.objects.filter(pk=datasource_id).update(schema_progress=text[:300])
        except DatabaseError:  # progress is for people to read: the refresh goes on
            logger.warning("datasource %s: schema progress not recorded", datasource_id)

    return record


# --- Vectors ---------------------------------------------------------------------------------


def knowledge_embed_missing(
    *, datasource_ids: list[int], embedder: Embedder | LocalEmbedder, limit: int = EMBED_BATCH
) -> int:
    """Embed up to ``limit`` entries of the datasources that have no vector by the
    embedder's model (new, edited, or made by another model) and store the vectors.
    Returns how many. Raises :class:`EmbeddingError` when the endpoint fails."""
    entries = knowledge_unembedded(datasource_ids=datasource_ids, model=embedder.model, limit=limit)
    if not entries:
        return 0
    vectors = embedder.embed([entry_document(entry) for entry in entries])
    with transaction.atomic():
        for entry, vector in zip(entries, vectors, strict=True):
            # Only if the entry did not change meanwhile (its text is what was embedded).
            KnowledgeEntry.objects.filter(pk=entry.pk, updated_at=entry.updated_at).update(
                vector=vector_bytes(vector), vector_model=embedder.model
            )
        for datasource_id in {entry.datasource_id for entry in entries}:
            _version_bump(datasource_id)
    return len(entries)


def knowledge_embed(*, datasource_id: int) -> int:
    """On the worker (after an entry changed): embed every entry of the datasource still
    without a vector by the configured model. Returns how many; 0 without embeddings or
    when the endpoint fails (logged; the next run's retrieval tries again)."""
    embedder = embedder_configured()
    if embedder is None:
        return 0
    done = 0
    try:
        while count := knowledge_embed_missing(datasource_ids=[datasource_id], embedder=embedder):
            done += count
    except EmbeddingError as error:
        logger.warning("datasource %s: embedding failed: %s", datasource_id, error)
    return done


def entry_document(entry: KnowledgeEntry) -> str:
    """The text an entry is embedded and shown as: its title, text and SQL."""
    parts = [entry.title, entry.text]
    if entry.sql:
        parts.append(f"SQL:\n{entry.sql}")
    return "\n".join(part for part in parts if part)


# --- What a run gets -------------------------------------------------------------------------


def tokens_of(text: str) -> int:
    """Tokens of ``text`` as paw-agent estimates them (~3.5 characters each)."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


@dataclass(frozen=True)
class IndexSource:
    """A datasource whose knowledge a run's sandbox gets as an index file: its ``slug``,
    ``knowledge_version`` and ``id``."""

    datasource_id: int
    slug: str
    version: int

    @property
    def file_name(self) -> str:
        """The index file's name: ``<slug>.v<version>.sqlite3`` (a new name per version)."""
        return f"{self.slug}.v{self.version}.sqlite3"


@dataclass(frozen=True)
class RunKnowledge:
    """What a run on datasources is given: ``entries`` (``[{"id", "datasource", "kind",
    "title", "text", "sql"}]``, and ``"verified": true`` on a verified example; most
    relevant first, within the token budget; ``id`` is the ``KnowledgeEntry``'s, for the
    run's lineage), the
    ``sources`` to make index files of for its ``search_knowledge`` tool
    (:func:`knowledge_index_write`), and the ``vector_model`` of their vectors ("" when
    embeddings are off)."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    sources: list[IndexSource] = field(default_factory=list)
    vector_model: str = ""


def knowledge_for_run(
    *, datasource_slugs: list[str], prompt: str, user: User | None
) -> RunKnowledge:
    """On the worker, before a run is submitted: the knowledge of the run's datasources,
    only those of them ``user`` (the run's) may use (``selectors.datasources_for_user``).

    ``entries``: the most relevant to ``prompt`` (hybrid search, see
    ``selectors.knowledge_search``; the query is embedded here when embeddings are
    configured, and entries still without a vector are embedded first, a batch at a time),
    packed greedily into ``PAW_KNOWLEDGE_CONTEXT_TOKENS`` (``context.context_select``:
    verified examples first among the examples; such an entry has ``"verified": true``);
    a flagged entry (``flag_reason``) or a stale example (``stale_since``) is never
    given. When nothing matches, the
    schema entries by title, so the agent at least knows the tables. ``sources``: the
    datasources with knowledge, at their current version. An embedding failure degrades
    to full-text (logged).
    """
    if not datasource_slugs:
        return RunKnowledge()
    datasources = list(
        datasources_for_user(user)
        .filter(slug__in=datasource_slugs, knowledge__isnull=False)
        .distinct()
        .order_by("slug")
    )
    if not datasources:
        return RunKnowledge()
    ids = [d.pk for d in datasources]
    slugs = {d.pk: d.slug for d in datasources}
    embedder = embedder_configured()
    query_vector = None
    if embedder is not None:
        try:
            knowledge_embed_missing(datasource_ids=ids, embedder=embedder)
            [query_vector] = embedder.embed([prompt])
        except EmbeddingError as error:
            logger.warning("knowledge retrieval without vectors: %s", error)
    vector_model = embedder.model if embedder is not None else ""

    def item_of(entry: KnowledgeEntry) -> dict[str, Any]:
        item: dict[str, Any] = {
            "datasource": slugs[entry.datasource_id],
            "kind": entry.kind,
            "title": entry.title,
            "text": entry.text,
            "sql": entry.sql,
        }
        if entry.verified_at is not None:
            item["verified"] = True  # paw-agent labels it for the model
        return item

    def cost(entry: KnowledgeEntry) -> int:
        return tokens_of(json.dumps(item_of(entry), ensure_ascii=False))  # what the model reads

    budget = settings.PAW_KNOWLEDGE_CONTEXT_TOKENS
    chosen = context_select(
        datasources=datasources,
        prompt=prompt,
        budget=budget,
        cost=cost,
        query_vector=query_vector,
        vector_model=vector_model,
    )
    if not chosen:
        fallback = (
            KnowledgeEntry.objects.filter(
                datasource_id__in=ids, kind=KnowledgeEntry.Kind.SCHEMA, flag_reason=""
            )
            .defer("vector")
            .order_by("title")[:100]
        )
        for entry in fallback:
            if cost(entry) <= budget:
                chosen.append(entry)
                budget -= cost(entry)
    entries = [{"id": entry.pk, **item_of(entry)} for entry in chosen]
    # Read after the embedding above: storing vectors bumped the versions.
    versions = (
        Datasource.objects.filter(pk__in=ids)
        .order_by("slug")
        .values_list("pk", "slug", "knowledge_version")
    )
    return RunKnowledge(
        entries=entries,
        sources=[
            IndexSource(datasource_id=pk, slug=slug, version=version)
            for pk, slug, version in versions
        ],
        vector_model=vector_model,
    )


#: The index file's tables (read by paw_agent/knowledge.py; the FTS5 manual, 4.4.3).
INDEX_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE entries (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, title TEXT NOT NULL,
                      text TEXT NOT NULL, sql TEXT NOT NULL, vector BLOB,
                      verified INTEGER NOT NULL DEFAULT 0);
CREATE VIRTUAL TABLE entries_fts USING fts5(title, text, sql, content='entries',
                                            content_rowid='id', tokenize='porter unicode61');
"""


def knowledge_index_write(*, source: IndexSource, path: Path, vector_model: str) -> None:
    """Write the knowledge of ``source``'s datasource as a new SQLite file at ``path`` (a
    place of PAW's own; the node puts it into the sandbox): table ``meta``
    (``datasource``, ``name``, ``dialect``, ``version``, ``vector_model``), ``entries``
    (id, kind, title, text, sql, the float32 vector by ``vector_model`` or NULL, and
    ``verified``: 1 for a verified example, else 0; neither flagged entries nor stale
    examples) and
    the FTS5 index ``entries_fts`` (porter stemming). Raises ``sqlite3.Error`` or
    ``OSError`` when it cannot be written."""
    datasource = Datasource.objects.defer("schema_tables").get(pk=source.datasource_id)
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.executescript(INDEX_SCHEMA)
        meta = {
            "datasource": datasource.slug,
            "name": datasource.name,
            "dialect": datasource.dialect,
            "version": str(source.version),
            "vector_model": vector_model,
        }
        db.executemany("INSERT INTO meta VALUES (?, ?)", meta.items())
        rows = KnowledgeEntry.objects.filter(
            datasource=datasource, flag_reason="", stale_since__isnull=True
        ).values_list("id", "kind", "title", "text", "sql", "vector", "vector_model", "verified_at")
        db.executemany(
            "INSERT INTO entries (id, kind, title, text, sql, vector, verified) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                (i, kind, title, text, sql, _vector_of(vector, model, vector_model), int(bool(at)))
                for i, kind, title, text, sql, vector, model, at in rows.iterator(chunk_size=1000)
            ),
        )
        db.execute("INSERT INTO entries_fts(entries_fts) VALUES ('rebuild')")
        db.commit()


def _vector_of(vector: Any, model: str, wanted: str) -> bytes | None:
    """A stored vector for the index file when it is by the ``wanted`` model."""
    return bytes(vector) if vector is not None and wanted and model == wanted else None
