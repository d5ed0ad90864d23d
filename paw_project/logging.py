"""Logging: request ids in every line, JSON lines on demand, and one configuration for
every process (web, Celery worker, beat).

Every log line carries ``request_id`` ("-" outside a request), so a line written deep in a
service can be matched to the HTTP request, websocket message or Celery task behind it.
"""

from __future__ import annotations

import contextvars
import logging
import logging.config
import threading
from datetime import UTC, datetime
from typing import Any

from pythonjsonlogger.json import JsonFormatter as _BaseJsonFormatter

request_id_var: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")


def configure(logging_settings: dict[str, Any]) -> None:
    """Apply ``settings.LOGGING`` (Django's ``LOGGING_CONFIG`` hook, also called for Celery's
    processes) and route ``warnings.warn`` through logging, so that with ``PAW_LOG_JSON=1``
    warnings are JSON lines too."""
    logging.config.dictConfig(logging_settings)
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    """An exception that ends a thread is logged (one JSON line with ``PAW_LOG_JSON=1``)
    instead of printed raw to stderr."""
    if args.exc_type is SystemExit:
        return
    thread = args.thread.name if args.thread is not None else "?"
    logging.getLogger("paw.threads").error(
        "uncaught exception in thread %s",
        thread,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


class RequestIdFilter(logging.Filter):
    """Adds ``record.request_id`` from the current context, unless the record already names
    one (an access line names the id of the response it describes); never drops a record."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not getattr(record, "request_id", None):
            record.request_id = request_id_var.get()
        return True


class SecurityOneLineFilter(logging.Filter):
    """Django logs each suspicious request (a bad ``Host`` header, mostly from scanners) at
    ERROR with a full traceback; the traceback says nothing the message does not. Such
    records become one WARNING line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.startswith("django.security.") and record.levelno > logging.WARNING:
            record.exc_info = None
            record.exc_text = None
            record.levelno = logging.WARNING
            record.levelname = "WARNING"
        return True


_CONTROL = {code: f"\\x{code:02x}" for code in [*range(0x20), 0x7F] if code != 0x09}
_CONTROL.update({0x0A: "\\n", 0x0D: "\\r"})


class TextFormatter(logging.Formatter):
    """The text format, one record to one line: control characters in the message (a
    newline in a request path, a NUL) are written as escapes, so nobody can forge a log
    line by putting one in a URL. Tracebacks, which PAW writes itself, stay multi-line."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = record.message.translate(_CONTROL)
        return super().formatMessage(record)


class JsonFormatter(_BaseJsonFormatter):
    """python-json-logger's formatter with ISO 8601 UTC times
    (``2025-01-31T12:00:00.123+00:00``)."""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return datetime.fromtimestamp(record.created, tz=UTC).isoformat(timespec="milliseconds")


def reset_request_id(**_: Any) -> None:
    """``request_finished`` receiver: lines after a response belong to no request.

    The middleware leaves the id set after the view so that Django's own ``django.request``
    line for the response carries it; under ASGI each request has its own context anyway,
    but a thread serving requests one after another (WSGI, the test client) must not
    lend one request's id to whatever it logs next."""
    request_id_var.set("-")
