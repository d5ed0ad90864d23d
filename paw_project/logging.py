"""Request ids for logs: a context variable set per request (or task) and a filter.

Every log line carries ``request_id`` ("-" outside a request), so a line written deep in a
service can be matched to the HTTP request, websocket message or Celery task behind it.
"""

from __future__ import annotations

import contextvars
import logging

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


class RequestIdFilter(logging.Filter):
    """Adds ``record.request_id`` from the current context; never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = request_id_var.get()
        return True
