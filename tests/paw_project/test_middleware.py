"""Every response carries X-Request-ID, and every log line names it."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
from datetime import datetime, timedelta

import pytest
from django.http import HttpResponse
from django.test import override_settings
from django.urls import path

from paw_project.logging import RequestIdFilter, SecurityOneLineFilter
from tests.processes import PYTHON, ROOT

log = logging.getLogger("tests.request_id")


def logging_view(request):
    log.warning("inside the view")
    return HttpResponse("ok")


def bad_gateway_view(request):
    return HttpResponse("upstream down", status=502)


urlpatterns = [path("log-me", logging_view), path("bad-gateway", bad_gateway_view)]


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.addFilter(RequestIdFilter())
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_response_carries_a_generated_request_id(client):
    response = client.get("/healthz")
    assert re.fullmatch(r"[0-9a-f]{32}", response["X-Request-ID"])
    assert client.get("/healthz")["X-Request-ID"] != response["X-Request-ID"]


def test_a_sane_client_request_id_is_echoed(client):
    response = client.get("/healthz", HTTP_X_REQUEST_ID="req-42.abc:1")
    assert response["X-Request-ID"] == "req-42.abc:1"


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "semi;colon", "<script>", "ok\n"])
def test_an_insane_client_request_id_is_replaced(client, bad):
    response = client.get("/healthz", HTTP_X_REQUEST_ID=bad)
    assert re.fullmatch(r"[0-9a-f]{32}", response["X-Request-ID"])


@override_settings(ROOT_URLCONF=__name__)
def test_log_lines_written_during_a_request_carry_its_id(client):
    handler = _Capture()
    log.addHandler(handler)
    try:
        response = client.get("/log-me", HTTP_X_REQUEST_ID="trace-me-1")
    finally:
        log.removeHandler(handler)
    assert response.status_code == 200
    assert [r.request_id for r in handler.records] == ["trace-me-1"]
    # Outside a request the id is reset.
    record = logging.LogRecord("x", logging.INFO, __file__, 1, "m", None, None)
    RequestIdFilter().filter(record)
    assert record.request_id == "-"


@override_settings(ROOT_URLCONF=__name__)
def test_djangos_own_line_for_an_error_response_carries_the_request_id(client):
    """Django logs a response (here a 502) after every middleware has returned."""
    handler = _Capture()
    django_request = logging.getLogger("django.request")
    django_request.addHandler(handler)
    try:
        response = client.get("/bad-gateway", HTTP_X_REQUEST_ID="trace-me-2")
    finally:
        django_request.removeHandler(handler)
    assert response.status_code == 502
    assert [(r.levelname, r.request_id) for r in handler.records] == [("ERROR", "trace-me-2")]


async def test_async_stack_sets_the_request_id_too(async_client):
    response = await async_client.get("/healthz", headers={"X-Request-ID": "async-1"})
    assert response["X-Request-ID"] == "async-1"


def test_paw_log_json_switches_logs_to_json_lines():
    env = {**os.environ, "PAW_LOG_JSON": "1", "DJANGO_SETTINGS_MODULE": "paw_project.settings"}
    code = (
        "import django, logging, warnings; django.setup(); "
        "from paw_project.logging import request_id_var; request_id_var.set('rid-7'); "
        "logging.getLogger('paw.test').warning('hello %s', 'json'); "
        "warnings.warn('careful')"
    )
    result = subprocess.run(
        [PYTHON, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = [json.loads(line) for line in result.stderr.strip().splitlines()]
    line = lines[0]
    assert line["message"] == "hello json"
    assert line["request_id"] == "rid-7"
    assert line["level"] == "WARNING"
    assert line["logger"] == "paw.test"
    assert datetime.fromisoformat(line["time"]).utcoffset() == timedelta(0)  # ISO 8601, UTC
    # warnings.warn goes through logging too
    assert lines[1]["logger"] == "py.warnings" and "careful" in lines[1]["message"]
    assert len(lines) == 2


def test_a_disallowed_host_is_one_warning_line_without_a_traceback(client):
    handler = _Capture()
    handler.addFilter(SecurityOneLineFilter())
    security = logging.getLogger("django.security.DisallowedHost")
    security.addHandler(handler)
    try:
        response = client.get("/healthz", HTTP_HOST="evil.example")
    finally:
        security.removeHandler(handler)
    assert response.status_code == 400
    [record] = handler.records
    assert (record.levelname, record.exc_info) == ("WARNING", None)


def test_a_newline_or_nul_in_a_request_path_cannot_forge_a_text_log_line():
    """The text format writes one record on one line: control characters in a path are
    escaped (``\\n``, ``\\x00``), so ``GET /x%0A… INFO paw.access …`` makes no second line."""
    env = {**os.environ, "PAW_LOG_JSON": "0", "DJANGO_SETTINGS_MODULE": "paw_project.settings"}
    forged = (
        '/nothing\n2026-12-01 08:00:00,000 INFO paw.access [forged] 10.6.6.6:1 "POST /admin/"\x00'
    )
    code = (
        "import django, logging; django.setup(); "
        f"logging.getLogger('paw.access').info('%s \"GET %s HTTP/1.1\" 404', '127.0.0.1:1', {forged!r})"
    )
    result = subprocess.run(
        [PYTHON, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    lines = [line for line in result.stderr.splitlines() if "paw.access" in line]
    assert len(lines) == 1, result.stderr
    assert "/nothing\\n2026-12-01 08:00:00,000 INFO paw.access [forged]" in lines[0]
    assert lines[0].endswith('"POST /admin/"\\x00 HTTP/1.1" 404')
