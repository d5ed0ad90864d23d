"""Audit rows for the tests of its reads (the API, the admin, the retention), recorded by
the audit's own service as the node records them."""

from __future__ import annotations

import datetime
import uuid

from audit.models import SqlStatement
from audit.services import sql_statement_record


def at(text: str) -> datetime.datetime:
    """``"2026-12-01T10:00"`` as an aware datetime in UTC."""
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC)


def recorded(
    user, *, time: str, datasource: str = "shop", statement: str = "SELECT 1", **fields
) -> SqlStatement:
    """A statement of ``user`` (with the teams they are in now) sent at ``time`` (UTC)."""
    run_id = uuid.uuid4()
    row = sql_statement_record(
        run_id=run_id,
        ordinal=1,
        time=at(time),
        user_id=user.pk,
        conversation_id=uuid.uuid4(),
        datasource=datasource,
        dialect="sqlite",
        statement=statement,
        outcome=fields.pop("outcome", "ok"),
        row_count=fields.pop("row_count", 1),
        duration_ms=fields.pop("duration_ms", 3),
        **fields,
    )
    assert row is not None
    return row
