"""Run by ``test_private_servers.py`` in a pytest session of its own, whose configured
servers do not exist: it checks that the session's private servers serve and reports
what they are (to the JSON file named by ``PAW_PROBE_REPORT``). Not collected by the
suite itself (the file name does not start with ``test_``)."""

from __future__ import annotations

import json
import os
from urllib.parse import urlsplit

import psycopg
import pymysql
import pytest
import redis
from django.conf import settings

from accounts.models import User
from tests.pawenv import PRIVATE

REPORT: dict = {}


def _write() -> None:
    with open(os.environ["PAW_PROBE_REPORT"], "w") as out:
        json.dump(REPORT, out)


@pytest.mark.django_db
def test_the_suite_runs_against_the_private_postgresql():
    """pytest-django made and migrated its test database on the private server."""
    User.objects.create_user(username="probe", password="a long probe password")
    assert User.objects.filter(username="probe").exists()
    database = settings.DATABASES["default"]
    with psycopg.connect(
        host=database["HOST"], port=database["PORT"], user=database["USER"], dbname=database["NAME"]
    ) as conn:
        REPORT["postgresql"] = {
            "url": os.environ["PAW_TEST_DATABASE_URL"],
            "port": conn.execute("SELECT inet_server_port()").fetchone()[0],
            "data_directory": conn.execute("SHOW data_directory").fetchone()[0],
            "pid": PRIVATE["PostgreSQL"].process.pid,
            "folder": str(PRIVATE["PostgreSQL"].folder),
        }
    _write()


def test_the_private_redis_serves():
    client = redis.Redis.from_url(os.environ["PAW_TEST_REDIS_URL"])
    client.set("probe", "yes")
    assert client.get("probe") == b"yes"
    REPORT["redis"] = {
        "url": os.environ["PAW_TEST_REDIS_URL"],
        "port": int(client.config_get("port")["port"]),
        "pid": client.info("server")["process_id"],
        "folder": str(PRIVATE["Redis"].folder),
    }
    _write()


def test_the_private_mariadb_serves(mariadb_url):
    server = urlsplit(mariadb_url)
    conn = pymysql.connect(
        host=server.hostname, port=server.port, user=server.username, database=server.path[1:]
    )
    with conn, conn.cursor() as cursor:
        cursor.execute("CREATE TABLE probe (id INT PRIMARY KEY)")
        cursor.execute("INSERT INTO probe VALUES (1)")
        cursor.execute("SELECT @@port, (SELECT count(*) FROM probe)")
        port, rows = cursor.fetchone()
    assert rows == 1
    REPORT["mariadb"] = {
        "url": mariadb_url,
        "port": port,
        "pid": PRIVATE["MariaDB"].process.pid,
        "folder": str(PRIVATE["MariaDB"].folder),
    }
    _write()
