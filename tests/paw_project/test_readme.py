"""The settings reference (docs/settings.md) documents every PAW_ setting the code reads."""

from __future__ import annotations

import re

from tests.processes import ROOT

# env.<type>("PAW_X"...), _path("PAW_X"...), os.environ.get("PAW_X"...), environ["PAW_X"]
_READ = re.compile(
    r"""(?:env(?:\.\w+)?|_path|environ(?:\.get)?|getenv)\(\s*["'](PAW_[A-Z0-9_]+)["']"""
)
# Variables PAW hands to the sandbox runtime (paw_agent/, not scanned), documented with the
# runtime, not as settings.
_SANDBOX_ENV = {"PAW_DATASOURCES", "PAW_SANDBOX_DATASOURCE_HOSTS"}


def _settings_read_by_the_code() -> set[str]:
    names: set[str] = set()
    apps = ("paw_project", "accounts", "conversations", "sandboxes", "billing", "secrets_vault", "sso")
    for app in apps:
        for path in (ROOT / app).glob("**/*.py"):
            names |= set(_READ.findall(path.read_text()))
    names |= set(re.findall(r"^(PAW_[A-Z0-9_]+) \?=", (ROOT / "Makefile").read_text(), re.M))
    return names - _SANDBOX_ENV


def test_every_paw_setting_is_in_the_settings_table():
    settings = (ROOT / "docs" / "settings.md").read_text()
    documented = set(re.findall(r"^\| `(PAW_[A-Z0-9_]+)` \|", settings, re.M))
    read = _settings_read_by_the_code()
    assert {"PAW_SECRET_KEY", "PAW_DATABASE_URL", "PAW_REDIS_URL"} <= read
    assert read - documented == set(), "settings missing from the table of docs/settings.md"
