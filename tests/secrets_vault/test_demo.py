"""The offline demo's datasource: tips.csv as a SQLite file, offered as demo-tips."""

from __future__ import annotations

import csv
import sqlite3

import pytest

from secrets_vault.models import Datasource
from secrets_vault.services import DEMO_DATASOURCE_SLUG, demo_datasource_ensure
from tests.processes import ROOT

pytestmark = pytest.mark.django_db

TIPS = ROOT / "sample_data" / "tips.csv"


def test_the_demo_datasource_is_the_tips_data_set_in_sqlite(
    tmp_path, django_capture_on_commit_callbacks
):
    db_path = tmp_path / "demo" / "tips.sqlite3"
    with django_capture_on_commit_callbacks() as callbacks:
        datasource = demo_datasource_ensure(csv_path=TIPS, db_path=db_path)
    assert len(callbacks) == 1  # its schema is harvested by a worker
    assert (datasource.slug, datasource.dialect, datasource.read_only, datasource.enabled) == (
        DEMO_DATASOURCE_SLUG, "sqlite", True, True,
    )  # fmt: skip
    assert datasource.connection == {"database": str(db_path)}
    with TIPS.open(newline="") as handle:
        expected = [
            (float(r["total_bill"]), float(r["tip"]), r["sex"], r["smoker"], r["day"], r["time"], int(r["size"]))
            for r in csv.DictReader(handle)
        ]  # fmt: skip
    with sqlite3.connect(db_path) as db:
        assert db.execute("SELECT * FROM tips").fetchall() == expected
    assert not list(db_path.parent.glob("*.partial"))


def test_an_operators_changes_are_kept_and_a_lost_file_is_built_again(tmp_path):
    db_path = tmp_path / "tips.sqlite3"
    demo_datasource_ensure(csv_path=TIPS, db_path=db_path)
    Datasource.objects.filter(slug=DEMO_DATASOURCE_SLUG).update(enabled=False, name="Old tips")
    db_path.unlink()
    again = demo_datasource_ensure(csv_path=TIPS, db_path=db_path)
    assert (again.enabled, again.name) == (False, "Old tips")
    assert Datasource.objects.filter(slug=DEMO_DATASOURCE_SLUG).count() == 1
    with sqlite3.connect(db_path) as db:
        assert db.execute("SELECT COUNT(*) FROM tips").fetchone() == (244,)


def test_the_demo_file_under_var_is_a_datasource_other_files_there_are_not(tmp_path, settings):
    """PAW's own folder is refused to datasources (its database, key and workspaces live
    there), but for the demo's: ``make run`` makes the tips file there and harvests it."""
    from paw_project.errors import InvalidRequest
    from secrets_vault.services import datasource_create
    from secrets_vault.services.knowledge import datasource_schema_refresh

    settings.VAR_DIR = tmp_path / "var"
    settings.DEMO_DATA_DIR = settings.VAR_DIR / "demo"
    datasource = demo_datasource_ensure(
        csv_path=TIPS, db_path=settings.DEMO_DATA_DIR / "tips.sqlite3"
    )
    datasource_schema_refresh(datasource_id=datasource.pk, user=None)
    datasource.refresh_from_db()
    assert datasource.schema_error == ""
    assert datasource.knowledge.filter(kind="schema", title__icontains="tips").exists()
    other = settings.VAR_DIR / "paw.sqlite3"
    sqlite3.connect(other).close()
    for path in (other, settings.DEMO_DATA_DIR / ".." / "paw.sqlite3"):
        with pytest.raises(InvalidRequest) as refused:
            datasource_create(
                slug="mine", name="Mine", dialect="sqlite", connection={"database": str(path)}
            )
        assert refused.value.code == "datasource_is_paw_database"
