"""Settings come only from PAW_ environment variables; a missing key is refused loudly."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.processes import PYTHON, ROOT

PRINT_SETTINGS = (
    "import django, json; django.setup(); from django.conf import settings as s; "
    "print(json.dumps({'debug': s.DEBUG, 'embedded': s.EMBEDDED, 'broker': s.CELERY_BROKER_URL, "
    "'layer': s.CHANNEL_LAYERS['default']['BACKEND'], 'cache': s.CACHES['default']['BACKEND'], "
    "'db': s.DATABASES['default']['ENGINE'], 'workspaces': str(s.PAW_WORKSPACE_ROOT), "
    "'hosts': s.ALLOWED_HOSTS}))"
)


def _django(env: dict[str, str], code: str = PRINT_SETTINGS) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("PAW_")}
    clean["DJANGO_SETTINGS_MODULE"] = "paw_project.settings"
    return subprocess.run(
        [PYTHON, "-c", code],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_missing_secret_key_without_debug_refuses_to_start(tmp_path):
    result = _django({"PAW_VAR_DIR": str(tmp_path)})
    assert result.returncode != 0
    assert "PAW_SECRET_KEY is not set" in result.stderr


def test_debug_without_secret_key_starts_with_a_development_key(tmp_path):
    result = _django({"PAW_DEBUG": "1", "PAW_VAR_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["debug"] is True


def test_no_redis_url_means_embedded_mode_on_sqlite(tmp_path):
    result = _django({"PAW_SECRET_KEY": "k" * 50, "PAW_VAR_DIR": str(tmp_path)})
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout)
    assert values["embedded"] is True
    assert values["broker"].startswith("memory://")
    assert values["layer"] == "channels.layers.InMemoryChannelLayer"
    assert values["cache"] == "django.core.cache.backends.locmem.LocMemCache"
    assert values["db"] == "django.db.backends.sqlite3"
    assert values["workspaces"] == str(tmp_path / "workspaces")
    assert (tmp_path).is_dir()


def test_redis_url_feeds_broker_channel_layer_and_cache(tmp_path):
    result = _django(
        {
            "PAW_SECRET_KEY": "k" * 50,
            "PAW_VAR_DIR": str(tmp_path),
            "PAW_REDIS_URL": "redis://127.0.0.1:6379/3",
            "PAW_DATABASE_URL": "postgres://postgres@127.0.0.1:5432/paw",
            "PAW_ALLOWED_HOSTS": "paw.example.org,localhost",
        }
    )
    assert result.returncode == 0, result.stderr
    values = json.loads(result.stdout)
    assert values["embedded"] is False
    assert values["broker"] == "redis://127.0.0.1:6379/3"
    assert values["layer"] == "channels_redis.core.RedisChannelLayer"
    assert values["cache"] == "django.core.cache.backends.redis.RedisCache"
    assert values["db"] == "django.db.backends.postgresql"
    assert values["hosts"] == ["paw.example.org", "localhost"]


def test_celery_is_json_only_late_ack_prefetch_one_with_limits():
    from paw_project.celery import app

    conf = app.conf
    assert conf.task_serializer == "json"
    assert conf.accept_content == ["json"]
    assert conf.task_acks_late is True
    assert conf.worker_prefetch_multiplier == 1
    assert conf.task_time_limit and conf.task_soft_time_limit
    assert conf.task_soft_time_limit < conf.task_time_limit
    from django.conf import settings

    assert conf.broker_transport_options["visibility_timeout"] > settings.PAW_RUN_TIMEOUT_SECONDS


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"PAW_SECRET_KEY": "   "}, "PAW_SECRET_KEY is not set."),
        (
            {"PAW_SECRET_KEY": "short-key"},
            "PAW_SECRET_KEY is too short (9 characters): use at least 32",
        ),
        (
            {"PAW_DATABASE_URL": ""},
            "PAW_DATABASE_URL is not a PostgreSQL or SQLite URL (no scheme://)",
        ),
        ({"PAW_DATABASE_URL": "nonsense"}, "PAW_DATABASE_URL is not a PostgreSQL or SQLite URL"),
        ({"PAW_DATABASE_URL": "mysql://u:s3cr3t@db/paw"}, "(scheme 'mysql'): use postgres://"),
        ({"PAW_DATABASE_URL": "postgres://u@db:port/paw"}, "PAW_DATABASE_URL is malformed"),
        ({"PAW_DATABASE_URL": "postgres://u@db:5432/"}, "PAW_DATABASE_URL names no database"),
        ({"PAW_LOG_LEVEL": "LOUD"}, "PAW_LOG_LEVEL='LOUD' is not a log level: use DEBUG, INFO"),
        ({"PAW_ALLOWED_HOSTS": ""}, "PAW_ALLOWED_HOSTS is empty: list the host names"),
        ({"PAW_ALLOWED_HOSTS": " , "}, "PAW_ALLOWED_HOSTS is empty"),
        (
            {"PAW_REDIS_URL": "127.0.0.1:6379"},
            "PAW_REDIS_URL must start with redis://, rediss:// or unix://",
        ),
        ({"PAW_PORT": "65536"}, "PAW_PORT='65536' is not a TCP port"),
        ({"PAW_SANDBOX_ISOLATION": "docker"}, "PAW_SANDBOX_ISOLATION='docker': use bwrap or none"),
        ({"PAW_DEMO": "yes"}, "PAW_DEMO='yes': use auto, 1 or 0."),
        ({"PAW_SHARING": "public"}, "PAW_SHARING='public': use off, teams or signed_in."),
        (
            {"PAW_WEB_PROCESSES": "2"},
            "and 1 (or unset) in the embedded mode, which is one process.",
        ),
        (
            {"PAW_WEB_PROCESSES": "-1"},
            "PAW_WEB_PROCESSES=-1: use a positive number (0: one per core)",
        ),
        ({"PAW_MAX_BODY_KIB": "0"}, "PAW_MAX_BODY_KIB=0: use a positive number."),
        (
            {"PAW_THROTTLE_RUNS": "5 per minute"},
            "PAW_THROTTLE_RUNS='5 per minute': use <count>/<second",
        ),
        ({"PAW_THROTTLE_AUTH": "10/fortnight"}, "PAW_THROTTLE_AUTH='10/fortnight': use"),
        (
            {"PAW_OIDC_ISSUER": "https://login.example.org"},
            "PAW_OIDC_ISSUER is set but PAW_OIDC_CLIENT_ID and PAW_OIDC_CLIENT_SECRET not",
        ),
        (
            {
                "PAW_OIDC_ISSUER": "login.example.org",
                "PAW_OIDC_CLIENT_ID": "paw",
                "PAW_OIDC_CLIENT_SECRET": "{secret:OIDC}",
            },
            "PAW_OIDC_ISSUER='login.example.org' is not a URL",
        ),
        ({"PAW_OIDC_STAFF_CLAIM": "groups="}, "PAW_OIDC_STAFF_CLAIM='groups=': use CLAIM"),
        ({"PAW_PASSWORD_LOGIN": "0"}, "PAW_PASSWORD_LOGIN=0 leaves no way to sign in"),
    ],
)
def test_bad_settings_are_refused_with_one_line_saying_what_to_do(tmp_path, env, message):
    base = {"PAW_SECRET_KEY": "k" * 50, "PAW_VAR_DIR": str(tmp_path)}
    result = _django({**base, **env}, code="import paw_project.settings")
    assert result.returncode != 0
    error = result.stderr.strip().splitlines()[-1]
    assert error.startswith("django.core.exceptions.ImproperlyConfigured: "), result.stderr
    assert message in error
    assert "s3cr3t" not in result.stderr  # a password in the URL is never echoed


def test_postgres_uses_a_bounded_connection_pool(tmp_path):
    code = (
        "import json; from paw_project import settings as s; "
        "print(json.dumps({k: s.DATABASES['default'][k] for k in ('CONN_MAX_AGE', 'OPTIONS')}))"
    )
    database = "postgres://postgres@127.0.0.1:5432/paw"
    base = {"PAW_SECRET_KEY": "k" * 50, "PAW_VAR_DIR": str(tmp_path), "PAW_DATABASE_URL": database}
    pooled = json.loads(_django({**base, "PAW_DB_POOL_MAX_SIZE": "7"}, code=code).stdout)
    assert pooled["CONN_MAX_AGE"] == 0
    assert pooled["OPTIONS"]["pool"]["max_size"] == 7
    unpooled = json.loads(_django({**base, "PAW_DB_POOL_MAX_SIZE": "0"}, code=code).stdout)
    assert "pool" not in unpooled["OPTIONS"]


def test_https_settings_are_off_by_default_and_can_be_turned_on(tmp_path):
    code = (
        "from paw_project import settings as s; print(s.SECURE_HSTS_SECONDS, s.SECURE_SSL_REDIRECT)"
    )
    base = {"PAW_SECRET_KEY": "k" * 50, "PAW_VAR_DIR": str(tmp_path)}
    assert _django(base, code=code).stdout.split() == ["0", "False"]
    on = {**base, "PAW_SECURE_HSTS_SECONDS": "31536000", "PAW_SECURE_SSL_REDIRECT": "1"}
    assert _django(on, code=code).stdout.split() == ["31536000", "True"]


def test_without_password_sign_in_registration_is_closed(tmp_path):
    env = {
        "PAW_SECRET_KEY": "k" * 50,
        "PAW_VAR_DIR": str(tmp_path),
        "PAW_PASSWORD_LOGIN": "0",
        "PAW_OIDC_ISSUER": "https://login.example.org",
        "PAW_OIDC_CLIENT_ID": "paw",
        "PAW_OIDC_CLIENT_SECRET": "{secret:OIDC_CLIENT_SECRET}",
    }
    code = (
        "import django, json; django.setup(); from django.conf import settings as s; "
        "print(json.dumps([s.PAW_PASSWORD_LOGIN, s.PAW_ALLOW_REGISTRATION, s.OIDC_RP_CLIENT_ID]))"
    )
    result = _django(env, code)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == [False, False, "paw"]
