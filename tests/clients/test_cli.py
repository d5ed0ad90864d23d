"""The ``paw`` command end to end, in a subprocess, against a real PAW stack: login and the
stored credentials, ask (text streamed, tool rows, an approval answered on stdin, uploads,
artifacts downloaded, the answer alone on stdout) and its exit codes."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from billing.models import Budget
from conversations.models import Conversation, Run
from conversations.selectors.workspaces import workspace_path
from tests.billing.ledger import ledger_event
from tests.clients.conftest import TIPS
from tests.conftest import SCRIPTED_API_KEY
from tests.processes import free_port
from tests.scripts import delete_script, demo_script

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

PAW = str(Path(sys.executable).parent / "paw")  # the console script the package installs


def paw(*args: str, stack, home: Path, token: str | None = None, stdin: str = "", url=None):
    """Run ``paw``; ``(exit code, stdout, stderr)``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAW_")}
    env.update({"XDG_CONFIG_HOME": str(home), "PAW_URL": url or stack.base, "NO_COLOR": "1"})
    if token:
        env["PAW_TOKEN"] = token
    done = subprocess.run(
        [PAW, *args], input=stdin, capture_output=True, text=True, env=env, timeout=120
    )
    return done.returncode, done.stdout, done.stderr


def test_login_stores_a_rotating_refresh_token_readable_by_its_owner_only(stack, person, tmp_path):
    code, _, err = paw(
        "login", "--username", "ada", "--password-stdin",
        stack=stack, home=tmp_path, stdin=person.password + "\n",
    )  # fmt: skip
    assert code == 0, err
    stored = tmp_path / "paw" / "credentials.json"
    assert stat.S_IMODE(stored.stat().st_mode) == 0o600
    assert stat.S_IMODE(stored.parent.stat().st_mode) == 0o700
    first = json.loads(stored.read_text())["servers"][stack.base]["refresh"]
    Conversation.objects.create(user=person.user, title="Kept")
    code, out, err = paw("conversations", stack=stack, home=tmp_path)
    assert code == 0, err
    assert out.strip().endswith("\tKept")
    # PAW rotated the refresh token; the file holds the new one, which works again.
    second = json.loads(stored.read_text())["servers"][stack.base]["refresh"]
    assert second != first
    assert paw("conversations", stack=stack, home=tmp_path)[0] == 0
    assert paw("logout", stack=stack, home=tmp_path)[0] == 0
    code, _, err = paw("conversations", stack=stack, home=tmp_path)
    assert code == 3 and "not_authenticated" in err and "paw login" in err


def test_ask_streams_the_work_uploads_downloads_and_prints_the_answer(
    stack, person, scripted_model, tmp_path
):
    scripted_model.load(demo_script())
    out_dir = tmp_path / "out"
    code, out, err = paw(
        "ask", "average tip by day, as a spreadsheet and a chart", "--file", str(TIPS),
        "--download", str(out_dir), stack=stack, home=tmp_path, token=person.token,
    )  # fmt: skip
    assert code == 0, err
    run = Run.objects.get(conversation__user=person.user)
    # stdout is a pipe: exactly the answer. The live work went to stderr.
    assert out == run.answer.rstrip("\n") + "\n"
    assert "I'll load the data with pandas" in err
    assert "→ run_python(code=" in err and "run_python: ok" in err
    assert err.index("I'll load the data") < err.index("→ run_python(")
    assert f"conversation {run.conversation_id}" in err and "done ·" in err
    assert "\033[" not in out + err  # no colours in a pipe
    workspace = workspace_path(run.conversation_id)
    for name in ("summary.xlsx", "chart.png"):
        assert (out_dir / name).read_bytes() == (workspace / name).read_bytes()
    assert sorted(p.name for p in out_dir.iterdir()) == ["chart.png", "summary.xlsx"]
    # The same conversation goes on; its files list shows the upload and the artifacts.
    code, listed, _ = paw(
        "files", str(run.conversation_id), stack=stack, home=tmp_path, token=person.token
    )
    assert code == 0
    assert [line.split("\t")[::2] for line in listed.splitlines()] == [
        ["upload", "tips.csv"], ["artifact", "chart.png"], ["artifact", "summary.xlsx"],
    ]  # fmt: skip
    fetched = tmp_path / "fetched"
    code, _, err = paw(
        "download", str(run.conversation_id), "tips.csv", "chart.png", "-o", str(fetched),
        stack=stack, home=tmp_path, token=person.token,
    )  # fmt: skip
    assert code == 0, err
    assert (fetched / "tips.csv").read_bytes() == TIPS.read_bytes()
    assert (fetched / "chart.png").read_bytes() == (workspace / "chart.png").read_bytes()


def test_an_approval_is_asked_at_the_prompt_and_answered_on_stdin(
    stack, person, scripted_model, tmp_path
):
    scripted_model.load(delete_script("old.txt"))
    conversation = Conversation.objects.create(user=person.user)
    (workspace_path(conversation.id)).mkdir(parents=True, exist_ok=True)
    (workspace_path(conversation.id) / "old.txt").write_text("bye")
    code, out, err = paw(
        "ask", "delete old.txt", "--conversation", str(conversation.id),
        stack=stack, home=tmp_path, token=person.token, stdin="y\n",
    )  # fmt: skip
    assert code == 0, err
    # The text streamed before the run could end: it waited for the answer given here.
    assert err.index("I will delete old.txt.") < err.index("? The agent wants to: ")
    assert "Approve? [y/N]" in err and "answer by" in err
    assert "→ delete_file(path='old.txt')" in err
    assert not (workspace_path(conversation.id) / "old.txt").exists()
    assert out.startswith("Result: ")


def test_no_declines_and_the_run_goes_on(stack, person, scripted_model, tmp_path):
    scripted_model.load(delete_script("keep.txt"))
    conversation = Conversation.objects.create(user=person.user)
    workspace_path(conversation.id).mkdir(parents=True, exist_ok=True)
    (workspace_path(conversation.id) / "keep.txt").write_text("stay")
    code, _, err = paw(
        "ask", "delete keep.txt", "-c", str(conversation.id), "--no",
        stack=stack, home=tmp_path, token=person.token,
    )  # fmt: skip
    assert code == 0, err
    assert "declined (--no)" in err
    assert (workspace_path(conversation.id) / "keep.txt").read_text() == "stay"


def test_exit_codes_a_failed_run_a_refusal_and_an_unreachable_server(
    stack, person, scripted_model, tmp_path
):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "responses": [{"error": 403, "times": 5}]})
    code, out, err = paw("ask", "hello", stack=stack, home=tmp_path, token=person.token)
    assert code == 1, err
    run = Run.objects.get(conversation__user=person.user)
    assert run.status == "error" and f"run error: {run.errors[0]['code']}" in err
    assert out == ""

    Budget.objects.create(user=person.user, monthly_tokens=10)
    ledger_event(user=person.user, input_tokens=100)
    code, out, err = paw("ask", "hello", stack=stack, home=tmp_path, token=person.token)
    assert code == 3 and "paw: budget_exhausted:" in err and out == ""

    nowhere = f"http://127.0.0.1:{free_port()}"
    code, _, err = paw("conversations", stack=stack, home=tmp_path, token=person.token, url=nowhere)
    assert code == 4 and "connection_failed" in err

    code, _, err = paw("ask", stack=stack, home=tmp_path, token=person.token)
    assert code == 2 and "prompt" in err

    code, out, err = paw("usage", stack=stack, home=tmp_path, token=person.token)
    assert code == 0, err
    assert "this month: 100 of 10 tokens" in out

    # A refused first run leaves no empty conversation behind, nor does a missing file
    # or an unknown datasource.
    assert Conversation.objects.filter(user=person.user).count() == 1
    code, _, err = paw(
        "ask", "hi", "--file", str(tmp_path / "nowhere.csv"), stack=stack, home=tmp_path,
        token=person.token,
    )  # fmt: skip
    assert code == 2 and "no such file" in err
    Budget.objects.filter(user=person.user).delete()
    code, _, err = paw(
        "ask", "hi", "--datasource", "nope", stack=stack, home=tmp_path, token=person.token
    )
    assert code == 3 and "unknown_datasource" in err
    assert Conversation.objects.filter(user=person.user).count() == 1


def test_on_a_terminal_the_text_streams_to_stdout_with_colours(
    stack, person, scripted_model, tmp_path
):
    """Under a pseudo-terminal: the agent's text and tool rows on the terminal, coloured;
    the answer not printed twice."""
    import pty
    import select

    scripted_model.load(demo_script())
    controller, terminal = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PAW_", "NO_COLOR"))}
    env.update({"XDG_CONFIG_HOME": str(tmp_path), "PAW_URL": stack.base, "PAW_TOKEN": person.token})
    process = subprocess.Popen(
        [PAW, "ask", "average tip by day, as a spreadsheet and a chart", "--file", str(TIPS)],
        stdin=subprocess.DEVNULL, stdout=terminal, stderr=terminal, env=env,
    )  # fmt: skip
    os.close(terminal)
    screen = b""
    while True:
        ready, _, _ = select.select([controller], [], [], 60)
        assert ready, f"no output for 60 s: {screen[-2000:]!r}"
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        screen += chunk
    os.close(controller)
    assert process.wait(timeout=30) == 0, screen.decode(errors="replace")
    text = screen.decode()
    run = Run.objects.get(conversation__user=person.user)
    assert "I'll load the data with pandas" in text and "\033[36m→ run_python(code=" in text
    assert "\033[32mok\033[0m" in text
    assert text.count("I saved the table as **summary.xlsx**") == 1
    assert run.status == "done"
