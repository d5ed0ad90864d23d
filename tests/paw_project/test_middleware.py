"""Every response carries X-Request-ID, and every log line names it."""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess

import pytest
from django.http import HttpResponse
from django.test import override_settings
from django.urls import path

from paw_project.logging import RequestIdFilter
from tests.support import PYTHON, ROOT

log = logging.getLogger("tests.request_id")


def logging_view(request):
    log.warning("inside the view")
    return HttpResponse("ok")


urlpatterns = [path("log-me", logging_view)]


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


@pytest.mark.parametrize("bad", ["has space", "x" * 129, "semi;colon", "<script>"])
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


async def test_async_stack_sets_the_request_id_too(async_client):
    response = await async_client.get("/healthz", headers={"X-Request-ID": "async-1"})
    assert response["X-Request-ID"] == "async-1"


def test_paw_log_json_switches_logs_to_json_lines():
    env = {**os.environ, "PAW_LOG_JSON": "1", "DJANGO_SETTINGS_MODULE": "paw_project.settings"}
    code = (
        "import django, logging; django.setup(); "
        "from paw_project.logging import request_id_var; request_id_var.set('rid-7'); "
        "logging.getLogger('paw.test').warning('hello %s', 'json')"
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
    line = json.loads(result.stderr.strip().splitlines()[-1])
    assert line["message"] == "hello json"
    assert line["request_id"] == "rid-7"
    assert line["level"] == "WARNING"
    assert line["logger"] == "paw.test"
    assert "time" in line
