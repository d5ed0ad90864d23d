"""Settings come only from PAW_ environment variables; a missing key is refused loudly."""

from __future__ import annotations

import json
import os
import subprocess

from tests.support import PYTHON, ROOT

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
