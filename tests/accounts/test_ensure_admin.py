"""`manage.py ensure_admin` creates the first administrator once."""

from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import authenticate, get_user_model
from django.core.management import call_command

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
    again = StringIO()
    call_command("ensure_admin", stdout=again)
    assert again.getvalue() == ""


def test_the_user_model_has_a_token_version():
    user = get_user_model().objects.create_user(username="ann", password="x-pass-123456")
    assert user.token_version == 0
