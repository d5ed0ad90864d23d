"""`manage.py ensure_admin` creates the first administrator once."""

from __future__ import annotations

import os
import subprocess
from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.processes import PYTHON, ROOT

pytestmark = pytest.mark.django_db


def test_creates_the_admin_with_the_configured_password_once(monkeypatch):
    monkeypatch.setenv("PAW_ADMIN_PASSWORD", "a-long-operator-password")
    call_command("ensure_admin", stdout=StringIO())
    call_command("ensure_admin", stdout=StringIO())
    admins = get_user_model().objects.filter(is_superuser=True)
    assert [a.username for a in admins] == ["admin"]
    assert authenticate(username="admin", password="a-long-operator-password") is not None


def test_generates_and_prints_a_password_once_when_none_is_given(monkeypatch):
    monkeypatch.delenv("PAW_ADMIN_PASSWORD", raising=False)
    out = StringIO()
    call_command("ensure_admin", stdout=out)
    password = out.getvalue().split("password: ")[1].split()[0]
    assert authenticate(username="admin", password=password) is not None
    # The way back from a lost password is named with it.
    assert "`make changepassword`" in out.getvalue()
    assert "manage.py changepassword admin" in out.getvalue()
    again = StringIO()
    call_command("ensure_admin", stdout=again)
    assert again.getvalue() == ""


def test_the_user_model_has_a_token_version():
    user = get_user_model().objects.create_user(username="ann", password="x-pass-123456")
    assert user.token_version == 0


def test_an_empty_username_means_admin(monkeypatch):
    monkeypatch.setenv("PAW_ADMIN_USERNAME", "  ")
    monkeypatch.setenv("PAW_ADMIN_PASSWORD", "a-long-operator-password")
    call_command("ensure_admin", stdout=StringIO())
    assert get_user_model().objects.get(is_superuser=True).username == "admin"


def test_a_weak_password_is_refused_with_the_validators_words(monkeypatch):
    monkeypatch.setenv("PAW_ADMIN_PASSWORD", "1234")
    with pytest.raises(CommandError) as refused:
        call_command("ensure_admin", stdout=StringIO())
    assert "PAW_ADMIN_PASSWORD is too weak: This password is too short." in str(refused.value)
    assert not get_user_model().objects.exists()


def test_a_non_admin_with_the_admins_name_is_reported_not_a_crash(monkeypatch):
    get_user_model().objects.create_user(username="admin", password="x-pass-123456")
    monkeypatch.setenv("PAW_ADMIN_PASSWORD", "a-long-operator-password")
    with pytest.raises(
        CommandError, match="A user named 'admin' exists but is not an administrator"
    ):
        call_command("ensure_admin", stdout=StringIO())


def test_a_refusal_exits_non_zero_from_the_command_line(tmp_path):
    env = {
        **os.environ,
        "PAW_REDIS_URL": "",
        "PAW_DATABASE_URL": f"sqlite:///{tmp_path / 'paw.sqlite3'}",
        "PAW_ADMIN_PASSWORD": "password",
    }
    subprocess.run([PYTHON, "manage.py", "migrate", "-v0"], cwd=ROOT, env=env, check=True)
    result = subprocess.run(
        [PYTHON, "manage.py", "ensure_admin"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert result.returncode == 1
    assert "This password is too common." in result.stderr


def test_the_way_back_from_a_lost_password_names_the_chosen_admin(monkeypatch):
    monkeypatch.setenv("PAW_ADMIN_USERNAME", "root")
    monkeypatch.setenv("PAW_ADMIN_PASSWORD", "a-long-operator-password")
    out = StringIO()
    call_command("ensure_admin", stdout=out)
    assert "`make changepassword ADMIN_USER=root`" in out.getvalue()
    assert "manage.py changepassword root" in out.getvalue()


def test_make_changepassword_runs_djangos_changepassword_on_make_runs_database():
    """``make -n`` shows the command without running it (it asks for the password twice
    on the terminal)."""
    result = subprocess.run(
        ["make", "-n", "changepassword", "ADMIN_USER=alice"],
        cwd=ROOT, capture_output=True, text=True, check=True, timeout=30,
    )  # fmt: skip
    assert 'manage.py changepassword "alice"' in result.stdout
    # The folder and secret key make run uses (PAW_VAR_DIR, default var/).
    assert f'PAW_VAR_DIR="{os.environ.get("PAW_VAR_DIR", "var")}"' in result.stdout
    assert "/secret_key" in result.stdout
