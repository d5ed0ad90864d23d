"""The offline demo's datasource: the tips data set (``sample_data/tips.csv``) as a SQLite
file, offered as datasource ``demo-tips`` while ``make run`` offers the demo model.

Started by ``manage.py runpaw`` (``paw_project/management/commands/runpaw.py``) when it
starts the scripted demo model; the demo script's SQL rule queries it
(``scripted_model/scripts/demo.json``).
"""

from __future__ import annotations

import csv
import logging
import os
import sqlite3
from pathlib import Path

from django.db import transaction

from secrets_vault.models import Datasource
from secrets_vault.services.knowledge import datasource_schema_refresh_request
from teams.models import Access

logger = logging.getLogger(__name__)

DEMO_DATASOURCE_SLUG = "demo-tips"
DEMO_TABLE_SQL = (
    "CREATE TABLE tips (total_bill REAL, tip REAL, sex TEXT, smoker TEXT, day TEXT, "
    "time TEXT, size INTEGER)"
)


def demo_tips_database(*, csv_path: Path, db_path: Path) -> Path:
    """The SQLite file ``db_path`` with ``csv_path`` (tips.csv's columns) as table ``tips``,
    built once: written beside it and renamed into place, so a stopped build never leaves
    half a table. An existing file is kept. Returns ``db_path``; raises ``OSError`` or
    ``sqlite3.Error`` when it cannot be built."""
    if db_path.exists():
        return db_path
    db_path.parent.mkdir(parents=True, exist_ok=True)
    partial = db_path.with_name(db_path.name + ".partial")
    partial.unlink(missing_ok=True)
    with csv_path.open(newline="", encoding="utf-8") as handle:
        rows = [
            (float(r["total_bill"]), float(r["tip"]), r["sex"], r["smoker"], r["day"],
             r["time"], int(r["size"]))
            for r in csv.DictReader(handle)
        ]  # fmt: skip
    connection = sqlite3.connect(partial)
    try:
        with connection:
            connection.execute(DEMO_TABLE_SQL)
            connection.executemany("INSERT INTO tips VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    finally:
        connection.close()
    os.replace(partial, db_path)
    return db_path


def demo_datasource_ensure(*, csv_path: Path, db_path: Path) -> Datasource:
    """Datasource :data:`DEMO_DATASOURCE_SLUG` (read-only SQLite on
    :func:`demo_tips_database`), created when missing. An existing row is left as the
    operator has it (disabled, renamed …) but for its file, which is built again when it
    is gone. A new row's schema is harvested by the worker (its knowledge)."""
    demo_tips_database(csv_path=csv_path, db_path=db_path)
    with transaction.atomic():
        datasource, created = Datasource.objects.get_or_create(
            slug=DEMO_DATASOURCE_SLUG,
            defaults={
                "name": "Tips (demo)",
                "description": "The offline demo's database: restaurant bills (tips.csv) "
                "in one table, tips.",
                "dialect": Datasource.Dialect.SQLITE,
                "connection": {"database": str(db_path)},
                "read_only": True,
                "enabled": True,
                "access": Access.EVERYONE,  # the demo's: everyone who signs in
            },
        )
        if created:
            datasource_schema_refresh_request(datasource=datasource, user=None)
            logger.info("demo datasource %s created on %s", datasource.slug, db_path)
    return datasource
