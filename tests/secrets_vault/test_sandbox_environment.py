"""What a sandbox is given: its owner's secrets, datasource URLs that really connect
(SQLite and the test PostgreSQL database), the provider, and what to mask."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from paw_project.errors import InvalidRequest
from sandboxes.launch import datasource_variables
from sandboxes.network import network_plan
from secrets_vault.masking import mask_secrets
from secrets_vault.models import Secret
from secrets_vault.services import (
    provider_resolve,
    sandbox_environment,
    secret_set,
)
from tests.factories import datasource_made
from tests.pgdatasource import pg_datasource_settings
from tests.secrets_vault.conftest import secret_value


@pytest.fixture
def sqlite_file(tmp_path):
    path = tmp_path / "shop data.sqlite3"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total REAL)")
        db.executemany("INSERT INTO orders (total) VALUES (?)", [(12.5,), (7.5,)])
    return path


def postgres_connection(password_placeholder: str) -> dict:
    return {
        **pg_datasource_settings(),
        "password": password_placeholder,
        "options": {"connect_timeout": 5, "application_name": "paw-vault-test"},
    }


def test_the_users_own_secrets_become_variables_and_global_ones_do_not(alice, bob):
    own, shared, bobs = secret_value("own"), secret_value("global"), secret_value("bob")
    secret_set(name="MY_TOKEN", value=own, user=alice)
    secret_set(name="TEAM_TOKEN", value=shared)
    secret_set(name="BOB_TOKEN", value=bobs, user=bob)
    environment = sandbox_environment(user=alice, datasource_slugs=[])
    assert environment.env == {"MY_TOKEN": own}
    assert environment.datasources == ()
    assert datasource_variables(environment.datasources) == {"PAW_DATASOURCES": "[]"}
    assert environment.secret_values == {"MY_TOKEN": own}
    assert own not in repr(environment)
    assert Secret.objects.get(name="MY_TOKEN").last_used_at is not None
    assert Secret.objects.get(name="TEAM_TOKEN").last_used_at is None


def test_unknown_or_disabled_datasources_are_refused_naming_them(alice, sqlite_file):
    datasource_made(
        slug="off", name="Off", dialect="sqlite", connection={"database": str(sqlite_file)},
        enabled=False,
    )  # fmt: skip
    with pytest.raises(InvalidRequest) as caught:
        sandbox_environment(user=alice, datasource_slugs=["off", "ghost"])
    assert caught.value.code == "unknown_datasource"
    assert caught.value.extra["slugs"] == ["off", "ghost"]


def test_a_datasource_needing_a_missing_secret_is_refused_naming_it(alice):
    datasource_made(
        slug="pg", name="PG", dialect="postgresql",
        connection=postgres_connection("{secret:NOT_SET_PW}"),
    )  # fmt: skip
    with pytest.raises(InvalidRequest) as caught:
        sandbox_environment(user=alice, datasource_slugs=["pg"])
    assert caught.value.code == "secret_missing"
    assert "pg" in caught.value.detail and "NOT_SET_PW" in caught.value.detail


def test_the_provider_is_given_as_openai_variables_and_its_key_is_masked(alice):
    key = secret_value("sk-global")
    secret_set(name="ANTHROPIC_API_KEY", value=key)
    choice = provider_resolve(user=alice, llm_provider="anthropic")
    environment = sandbox_environment(user=alice, datasource_slugs=[], provider=choice)
    assert environment.env["OPENAI_BASE_URL"] == "https://api.anthropic.com/v1/"
    assert environment.env["OPENAI_API_KEY"] == key
    assert environment.env["OPENAI_MODEL"] == "claude-sonnet-4-6"
    assert "ANTHROPIC_API_KEY" not in environment.env, "global secrets are not variables"
    assert environment.secret_values == {"ANTHROPIC_API_KEY": key}


# Plays the agent inside the sandbox: connects with the URLs it was given, tries a write,
# and prints everything, secrets included, as an agent might.
SANDBOX_SCRIPT = r"""
import json, os, sqlite3, urllib.parse
import psycopg

out = {"datasources": json.loads(os.environ["PAW_DATASOURCES"]), "results": {}}
for ds in out["datasources"]:
    url = os.environ[ds["env"]]
    if ds["dialect"] == "sqlite":
        parts = urllib.parse.urlsplit(url)
        path = urllib.parse.unquote(url[len("sqlite:///"):].split("?")[0])
        db = sqlite3.connect(f"file:{urllib.parse.quote(path)}?{parts.query}", uri=True)
        rows = db.execute("SELECT count(*), sum(total) FROM orders").fetchone()
        try:
            db.execute("DELETE FROM orders")
            write = "allowed"
        except sqlite3.OperationalError as exc:
            write = f"refused: {exc}"
    else:
        with psycopg.connect(url) as db:
            sql = "SELECT current_database(), current_setting('application_name')"
            rows = db.execute(sql).fetchone()
            try:
                db.execute("CREATE TABLE paw_vault_probe (id int)")
                write = "allowed"
            except psycopg.Error as exc:
                write = f"refused: {exc}"
    out["results"][ds["slug"]] = {"rows": list(rows), "write": write, "url": url}
out["printed_secret"] = "my token is " + os.environ["MY_TOKEN"]
print(json.dumps(out))
"""


def test_a_sandbox_queries_sqlite_and_postgresql_with_its_urls_and_its_output_is_masked(
    alice, sqlite_file
):
    token, pg_password = secret_value("tok"), secret_value("pg/pw@!")
    secret_set(name="MY_TOKEN", value=token, user=alice)
    # PostgreSQL trusts loopback here, so any password connects; it must still travel.
    secret_set(name="SHOP_PG_PASSWORD", value=pg_password)
    datasource_made(
        slug="shop-files", name="Shop file", dialect="sqlite", description="Orders (SQLite)",
        connection={"database": str(sqlite_file)},
    )  # fmt: skip
    datasource_made(
        slug="shop_pg", name="Shop PG", dialect="postgresql", description="Orders (PostgreSQL)",
        connection=postgres_connection("{secret:SHOP_PG_PASSWORD}"),
    )  # fmt: skip

    environment = sandbox_environment(user=alice, datasource_slugs=["shop-files", "shop_pg"])
    described = json.loads(datasource_variables(environment.datasources)["PAW_DATASOURCES"])
    assert described == [
        {"slug": "shop-files", "name": "Shop file", "dialect": "sqlite",
         "description": "Orders (SQLite)", "env": "PAW_DATASOURCE_SHOP_FILES_URL",
         "read_only": True},
        {"slug": "shop_pg", "name": "Shop PG", "dialect": "postgresql",
         "description": "Orders (PostgreSQL)", "env": "PAW_DATASOURCE_SHOP_PG_URL",
         "read_only": True},
    ]  # fmt: skip
    pg_url = environment.env["PAW_DATASOURCE_SHOP_PG_URL"]
    assert "{secret:" not in pg_url and "pg%2Fpw%40%21" in pg_url
    assert environment.secret_values["SHOP_PG_PASSWORD"] == pg_password
    assert environment.secret_values["PAW_DATASOURCE_SHOP_PG_URL"] == pg_url

    result = subprocess.run(
        [sys.executable, "-c", SANDBOX_SCRIPT],
        env={
            "PATH": os.environ["PATH"],
            **environment.env,
            **datasource_variables(environment.datasources),
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert output["results"]["shop-files"]["rows"] == [2, 20.0]
    assert output["results"]["shop-files"]["write"].startswith("refused"), "read-only SQLite"
    assert output["results"]["shop_pg"]["rows"] == [
        pg_datasource_settings()["database"],
        "paw-vault-test",
    ]
    assert "read-only transaction" in output["results"]["shop_pg"]["write"]

    masked = mask_secrets(output, environment.secret_values)
    text = json.dumps(masked)
    assert token not in text and pg_password not in text and "pg%2Fpw%40%21" not in text
    assert masked["printed_secret"] == "my token is [secret:MY_TOKEN]"
    assert masked["results"]["shop_pg"]["url"] == "[secret:PAW_DATASOURCE_SHOP_PG_URL]"
    # A URL without any secret in it is not worth masking.
    assert masked["results"]["shop-files"]["url"].startswith("sqlite:///")


def test_a_runs_datasources_allowed_hosts_reach_its_sandbox_once_each(alice, sqlite_file, settings):
    for slug, hosts in (("a", ["api.internal:443", "*.corp.test"]), ("b", ["api.internal:443"])):
        datasource_made(
            slug=slug, name=slug, dialect="sqlite", connection={"database": str(sqlite_file)},
            allowed_hosts=hosts,
        )  # fmt: skip
    settings.PAW_SANDBOX_ALLOWED_HOSTS = []
    both = sandbox_environment(user=alice, datasource_slugs=["a", "b"])
    assert [d.allowed_hosts for d in both.datasources] == [
        ("api.internal:443", "*.corp.test"),
        ("api.internal:443",),
    ]
    assert network_plan(both.env, both.datasources).policy.patterns == (
        "api.internal:443",
        "*.corp.test",
    )
    assert network_plan({}, ()).policy.patterns == ()
