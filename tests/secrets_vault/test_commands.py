"""`manage.py secret set|delete|list`: values from stdin only, never shown."""

from __future__ import annotations

import io
import subprocess

import pytest
from django.core.management import CommandError, call_command

from secrets_vault.models import Secret
from tests.processes import PYTHON, ROOT, worker_database_url
from tests.secrets_vault.conftest import secret_value


def run(*args: str, stdin: str = "") -> str:
    out = io.StringIO()
    call_command("secret", *args, stdin=io.StringIO(stdin), stdout=out)
    return out.getvalue()


def test_set_reads_the_value_from_stdin_and_list_never_shows_it(alice):
    value = secret_value("cli")
    assert "Created secret CLI_KEY (user alice)" in run(
        "set", "CLI_KEY", "--user", "alice", stdin=value + "\n"
    )
    assert Secret.objects.get(name="CLI_KEY", owner=alice).value == value, "one newline removed"
    assert "Updated secret CLI_KEY (user alice)" in run(
        "set", "CLI_KEY", "--user", "alice", stdin=value
    )
    assert "Created secret CLI_KEY (global)" in run("set", "CLI_KEY", stdin=value)
    listing = run("list")
    assert "CLI_KEY\tglobal" in listing and "CLI_KEY\tuser\talice" in listing
    assert value not in listing
    assert "CLI_KEY" in run("list", "--user", "alice")
    assert "Deleted secret CLI_KEY (global)" in run("delete", "CLI_KEY")
    assert Secret.objects.filter(name="CLI_KEY").count() == 1


def test_the_value_cannot_be_given_as_an_argument_and_errors_are_clear(alice):
    with pytest.raises(CommandError):
        run("set", "ARGV_KEY", "the-value-on-the-command-line")
    with pytest.raises(CommandError, match="No value on standard input"):
        run("set", "ARGV_KEY", stdin="")
    with pytest.raises(CommandError, match="No user named 'nobody'"):
        run("set", "ARGV_KEY", "--user", "nobody", stdin="abcdef")
    with pytest.raises(CommandError, match="upper-case letter"):
        run("set", "bad-name", stdin="abcdef")
    with pytest.raises(CommandError, match="No secret GHOST"):
        run("delete", "GHOST")
    assert not Secret.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_secret_set_from_a_pipe_in_a_real_process(alice):
    value = secret_value("pipe")
    result = subprocess.run(
        [PYTHON, "manage.py", "secret", "set", "PIPED_KEY", "--user", "alice"],
        cwd=ROOT,
        input=value,
        env={**__import__("os").environ, "PAW_DATABASE_URL": worker_database_url()},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert value not in result.stdout + result.stderr
    assert Secret.objects.get(name="PIPED_KEY", owner=alice).value == value
