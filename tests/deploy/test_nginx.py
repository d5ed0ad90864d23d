"""The nginx example: a body limit matching PAW's, websockets upgraded, and a
configuration nginx itself accepts (``nginx -t``, where nginx is installed)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from paw_project.asgi_limits import BodyKind, kind_limit
from tests.processes import ROOT

CONF = ROOT / "deploy" / "nginx" / "paw.conf"
SIZES = {"k": 1024, "m": 1024**2, "g": 1024**3}


def directive(name: str) -> list[str]:
    return re.findall(rf"^\s*{name}\s+([^;]+);", CONF.read_text(), flags=re.MULTILINE)


def test_the_body_limit_lets_every_upload_paw_takes_reach_it_and_stops_far_larger_ones(settings):
    (size,) = directive("client_max_body_size")
    number, unit = re.fullmatch(r"(\d+)([kmg]?)", size.strip().lower()).groups()
    limit = int(number) * SIZES.get(unit, 1)
    # At least what PAW accepts (the file plus its multipart envelope), so PAW answers its
    # own 413 naming the limit; at most a MiB more.
    assert settings.PAW_MAX_UPLOAD_BYTES == 100 * 1024**2  # the value deploy/paw.env sets
    assert kind_limit(BodyKind.UPLOAD) <= limit <= settings.PAW_MAX_UPLOAD_BYTES + 1024**2
    assert directive("proxy_request_buffering") == ["off"]


def test_websockets_are_upgraded_and_live_longer_than_the_chat_pages_heartbeat():
    text = CONF.read_text()
    assert "proxy_set_header Upgrade $http_upgrade" in text
    assert "proxy_set_header Connection $connection_upgrade" in text
    assert "proxy_http_version 1.1" in text
    assert "proxy_read_timeout 1h" in text
    assert directive("proxy_set_header").count("X-Forwarded-Proto $scheme") == 1


@pytest.mark.skipif(not shutil.which("nginx"), reason="nginx is not installed (Debian: nginx)")
def test_nginx_accepts_the_configuration(tmp_path):
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=paw.example.org", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    site = CONF.read_text()
    site = site.replace("/etc/letsencrypt/live/paw.example.org/fullchain.pem", str(cert))
    site = site.replace("/etc/letsencrypt/live/paw.example.org/privkey.pem", str(key))
    (tmp_path / "paw.conf").write_text(site)
    (tmp_path / "nginx.conf").write_text(
        f"pid {tmp_path}/nginx.pid;\nerror_log {tmp_path}/error.log;\nevents {{}}\n"
        f"http {{\n  access_log off;\n  include {tmp_path}/paw.conf;\n}}\n"
    )
    result = subprocess.run(
        ["nginx", "-t", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    # nginx 1.25.1 and later call "listen ... http2" deprecated (the file says what to use).
    warnings = [
        line for line in result.stderr.splitlines()
        if ("[warn]" in line and "http2" not in line) or "[emerg]" in line
    ]  # fmt: skip
    assert not warnings, result.stderr
