"""`make test` on a machine where nothing is running: a pytest session whose configured
PostgreSQL, Redis and MariaDB do not answer starts private servers, runs against them
and removes them at the end; a missing binary is named with its Debian package."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests import private_servers
from tests.private_servers import ServerUnavailable, find_binary
from tests.processes import PYTHON, ROOT, free_port

PROBE = "tests/paw_project/private_servers_probe.py"


def process_exists(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie waiting to be reaped)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.mark.slow
def test_a_session_with_nothing_listening_starts_private_servers_and_removes_them(tmp_path):
    ports = {"postgresql": free_port(), "redis": free_port(), "mariadb": free_port()}
    for port in ports.values():
        assert not private_servers.listening("127.0.0.1", port)
    report = tmp_path / "report.json"
    env = {
        **os.environ,
        "PAW_TEST_DATABASE_URL": f"postgres://postgres@127.0.0.1:{ports['postgresql']}/paw_probe",
        "PAW_TEST_REDIS_URL": f"redis://127.0.0.1:{ports['redis']}/4",
        "PAW_TEST_MARIADB_URL": f"mysql://root@127.0.0.1:{ports['mariadb']}/probe",
        "PAW_PROBE_REPORT": str(report),
    }
    env.pop("PAW_TEST_PRIVATE_SERVERS", None)  # the default: private when nothing answers
    result = subprocess.run(
        [PYTHON, "-m", "pytest", PROBE, "-p", "no:cacheprovider", "--create-db", "-q"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "3 passed" in output, output
    servers = json.loads(report.read_text())
    assert set(servers) == {"postgresql", "redis", "mariadb"}
    for kind, server in servers.items():
        # Not the configured (dead) port: a private server's, named in the session's URL.
        assert server["port"] != ports[kind]
        assert f"127.0.0.1:{server['port']}/" in server["url"]
        # Gone afterwards: the process, the folder, and the port.
        assert not process_exists(server["pid"]), f"{kind} still runs"
        assert not Path(server["folder"]).exists(), f"{kind} left {server['folder']}"
        assert not private_servers.listening("127.0.0.1", server["port"])
    assert servers["postgresql"]["data_directory"].startswith(servers["postgresql"]["folder"])


def test_private_servers_are_not_started_when_told_not_to(tmp_path):
    env = {
        **os.environ,
        "PAW_TEST_DATABASE_URL": f"postgres://postgres@127.0.0.1:{free_port()}/paw_probe",
        "PAW_TEST_PRIVATE_SERVERS": "0",
    }
    result = subprocess.run(
        [PYTHON, "-m", "pytest", PROBE, "-p", "no:cacheprovider", "-q"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 3, result.stdout + result.stderr
    assert "PostgreSQL is not reachable at 127.0.0.1:" in result.stdout + result.stderr
    assert "pg_ctlcluster" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("binary", "package"),
    [("initdb", "postgresql"), ("redis-server", "redis-server"), ("mariadbd", "mariadb-server")],
)
def test_a_missing_binary_is_named_with_its_debian_package(binary, package, tmp_path):
    with pytest.raises(ServerUnavailable) as error:  # nothing to be found in an empty folder
        find_binary(binary, package=package, search=[str(tmp_path)], path=str(tmp_path))
    assert str(error.value) == (
        f"{binary} was not found: install Debian's {package} (apt-get install {package})."
    )


def test_postgresql_binaries_are_found_in_debians_versioned_folders():
    folders = private_servers.postgres_bin_dirs()
    assert folders, "Debian's postgresql package is installed here"
    assert find_binary("initdb", package="postgresql", search=folders) == f"{folders[0]}/initdb"
