"""``PAW_AUDIT_RETENTION_DAYS``: beat's hourly task removes the audit's rows older than
that (SQL statements with their teams, and the admin log of operators' writes); ``0``
keeps them all."""

from __future__ import annotations

import datetime

import pytest
from django.conf import settings as django_settings
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Group
from django.utils import timezone

from audit import tasks
from audit.models import SqlStatement, SqlStatementTeam
from audit.services import audit_prune
from paw_project.celery import app
from tests.audit.records import recorded

pytestmark = pytest.mark.django_db


def days_ago(days: int) -> str:
    return (timezone.now() - datetime.timedelta(days=days)).replace(tzinfo=None).isoformat()


@pytest.fixture
def aged(user):
    user.groups.add(Group.objects.create(name="analysts"))
    rows = {n: recorded(user, time=days_ago(n)) for n in (1, 29, 31, 400)}
    for n in (2, 45):
        entry = LogEntry.objects.create(
            user=user, object_id="1", object_repr="x", action_flag=CHANGE, change_message=f"{n}"
        )
        LogEntry.objects.filter(pk=entry.pk).update(
            action_time=timezone.now() - datetime.timedelta(days=n)
        )
    return rows


def test_beat_removes_what_is_older_than_the_retention(settings, aged):
    settings.PAW_AUDIT_RETENTION_DAYS = 30
    assert tasks.audit_prune() == {"statements": 2, "log_entries": 1}
    assert set(SqlStatement.objects.values_list("id", flat=True)) == {aged[1].id, aged[29].id}
    assert SqlStatementTeam.objects.count() == 2  # the removed rows' teams went with them
    assert list(LogEntry.objects.values_list("change_message", flat=True)) == ["2"]
    assert tasks.audit_prune() == {"statements": 0, "log_entries": 0}


def test_zero_keeps_everything(settings, aged):
    settings.PAW_AUDIT_RETENTION_DAYS = 0
    assert audit_prune() == {"statements": 0, "log_entries": 0}
    assert SqlStatement.objects.count() == 4 and LogEntry.objects.count() == 2


def test_the_default_is_a_year_and_beat_runs_the_task_hourly():
    assert django_settings.PAW_AUDIT_RETENTION_DAYS == 365
    entry = django_settings.CELERY_BEAT_SCHEDULE["audit-prune"]
    assert entry == {"task": tasks.TASK_AUDIT_PRUNE, "schedule": 3600.0}
    app.loader.import_default_modules()
    assert tasks.TASK_AUDIT_PRUNE in app.tasks
