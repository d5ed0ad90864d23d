"""The ``paw`` command: PAW from a terminal (or a script).

::

    paw login [--username NAME] [--password-stdin]
    paw ask "…" [--file F]... [--conversation ID] [--provider P] [--model M]
                [--datasource D]... [--download DIR] [--yes | --no]
    paw conversations | paw files CONVERSATION | paw download CONVERSATION PATH... [-o DIR]
    paw usage | paw logout

The server is ``--url``, else ``PAW_URL``, else the one ``paw login`` stored, else
``http://127.0.0.1:8000``. Credentials: ``--token`` or ``PAW_TOKEN`` (a personal API token),
else the refresh token ``paw login`` stored in ``$XDG_CONFIG_HOME/paw/credentials.json``
(``~/.config/paw/``, mode 0600; PAW rotates it on every use and the file follows).

On a terminal the agent's text streams to stdout with coloured tool rows and progress
bars. When stdout is not a terminal it carries only the final answer (no colours, no
progress); the live text, tool rows and prompts go to stderr.

Exit codes: 0 the run ended ``done``; 1 it ended ``error`` or ``cancelled`` (the error's
code is printed); 2 bad usage; 3 PAW refused a request (its code is printed), 4 PAW cannot
be reached; 130 interrupted (the run is cancelled first).
"""

from __future__ import annotations

import argparse
import contextlib
import getpass
import json
import os
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from paw_client.client import Client, Run
from paw_client.errors import ConnectionFailed, PawError
from paw_client.models import Approval, Event
from paw_client.view import RunView, plan_lines

DEFAULT_URL = "http://127.0.0.1:8000"
EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_REFUSED, EXIT_UNREACHABLE = 0, 1, 2, 3, 4
EXIT_INTERRUPTED = 130


# --- stored credentials -------------------------------------------------------------------


def config_path() -> Path:
    """``$XDG_CONFIG_HOME/paw/credentials.json`` (``~/.config/paw/credentials.json``)."""
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(Path.home(), ".config")
    return Path(base) / "paw" / "credentials.json"


def load_config() -> dict[str, Any]:
    try:
        data = json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {"servers": {}}
    return (
        data
        if isinstance(data, dict) and isinstance(data.get("servers"), dict)
        else {"servers": {}}
    )


def save_config(data: dict[str, Any]) -> None:
    """Write the credentials file atomically, readable by its owner only (0600, folder 0700)."""
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=".credentials-")
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=2)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _remember(url: str, **fields: Any) -> None:
    data = load_config()
    data["servers"][url] = {**data["servers"].get(url, {}), **fields}
    data["default"] = url
    save_config(data)


# --- terminal output ------------------------------------------------------------------------


class Output:
    """Where things go: ``answer`` (stdout), ``live`` (the streamed text and tool rows:
    stdout on a terminal, else stderr), ``note`` (stderr). Colours and progress bars
    only on a terminal (and never with ``NO_COLOR``)."""

    def __init__(self, stdout: TextIO, stderr: TextIO) -> None:
        self.stdout, self.stderr = stdout, stderr
        self.tty = stdout.isatty()
        self.live = stdout if self.tty else stderr
        self.color = self.tty and not os.environ.get("NO_COLOR")
        self.progress_bars = self.tty and stderr.isatty()
        self._mid_line = False

    def paint(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.color else text

    def text(self, delta: str) -> None:
        self.live.write(delta)
        self.live.flush()
        self._mid_line = not delta.endswith("\n")

    def line(self, text: str, *, stream: TextIO | None = None) -> None:
        target = stream or self.live
        if self._mid_line:
            target.write("\n")
            self._mid_line = False
        target.write(text + "\n")
        target.flush()

    def note(self, text: str) -> None:
        self.line(text, stream=self.stderr)

    def progress(self, label: str, done: int, total: int | None) -> None:
        if not self.progress_bars:
            return
        if total:
            filled = int(30 * done / total)
            bar = "#" * filled + "-" * (30 - filled)
            self.stderr.write(f"\r{label} [{bar}] {done * 100 // total:3d}%")
        else:
            self.stderr.write(f"\r{label} {done:,} bytes")
        if total and done >= total:
            self.stderr.write("\n")
        self.stderr.flush()


# --- commands ---------------------------------------------------------------------------


def _client(args: argparse.Namespace) -> Client:
    token = args.token or os.environ.get("PAW_TOKEN")
    if token:
        return Client(args.url, token=token)
    stored = load_config()["servers"].get(args.url) or {}
    if not stored.get("refresh"):
        raise PawError(
            f"Not signed in to {args.url}: run `paw login`, or set PAW_TOKEN.",
            code="not_authenticated",
        )
    return Client(
        args.url,
        refresh_token=stored["refresh"],
        on_refresh=lambda refresh: _remember(args.url, refresh=refresh),
    )


def cmd_login(args: argparse.Namespace, out: Output) -> int:
    username = args.username or input("Username: ").strip()
    read = (lambda: sys.stdin.readline().rstrip("\n")) if args.password_stdin else None
    password = read() if read else getpass.getpass("Password: ")
    with Client(args.url) as paw:
        pair = paw.login(username, password)
        _remember(args.url, username=username, refresh=pair["refresh"])
    out.note(f"Signed in to {args.url} as {username} (saved in {config_path()}).")
    return EXIT_OK


def cmd_logout(args: argparse.Namespace, out: Output) -> int:
    data = load_config()
    if data["servers"].pop(args.url, None) is not None:
        save_config(data)
        out.note(f"Forgot the credentials for {args.url}.")
    return EXIT_OK


def _ask_approval(approval: Approval, args: argparse.Namespace, out: Output) -> bool | list[str]:
    """Decide an approval: ``--yes``/``--no`` for a confirm, else ask at the prompt (an
    empty line or the end of input declines, and answers a question "Unanswered")."""
    left = approval.seconds_left()
    deadline = ""
    if approval.expires is not None:
        local = approval.expires.astimezone().strftime("%H:%M:%S")
        deadline = f" (answer by {local}, {max(0, int(left or 0))} s left)"
    if approval.kind == "confirm":
        out.line(
            out.paint(f"? The agent wants to: {approval.prompt}", "1;33") + deadline,
            stream=out.stderr,
        )
        if args.yes or args.no:
            out.note("  approved (--yes)" if args.yes else "  declined (--no)")
            return bool(args.yes)
        out.stderr.write("  Approve? [y/N] ")
        out.stderr.flush()
        reply = sys.stdin.readline().strip().lower()
        return reply in ("y", "yes")
    answers = []
    for index, question in enumerate(approval.questions):
        options = approval.options(index)
        out.line(
            out.paint(f"? {question.get('question', '')}", "1;33") + deadline, stream=out.stderr
        )
        for number, option in enumerate(options, 1):
            out.note(f"  {number}. {option}")
        out.stderr.write("  Answer (a number or text): ")
        out.stderr.flush()
        reply = sys.stdin.readline().strip()
        if reply.isdigit() and 1 <= int(reply) <= len(options):
            reply = options[int(reply) - 1]
        answers.append(reply or "Unanswered")
    return answers


def _show(event: Event, view: RunView, out: Output) -> None:
    change = view.feed(event)
    if change == "text":
        out.text(event.text)
    elif change == "tool":
        out.line(out.paint(f"→ {view.tools[-1].label}", "36") + " running…")
    elif change == "tool_done":
        row = view.last_tool
        mark = out.paint("ok", "32") if row.status == "ok" else out.paint("error", "31")
        out.line(f"  {row.name}: {mark}" + (f" · {row.summary}" if row.summary else ""))
    elif change == "plan":
        out.line(out.paint("Plan:", "1"))
        for line in plan_lines(view.plan):
            out.line(f"  {line}")
    elif change == "notice":
        out.line(out.paint(f"! {view.notices[-1]}", "33"))


def cmd_ask(args: argparse.Namespace, out: Output) -> int:
    paw = _client(args)
    files = [Path(f) for f in args.file or []]
    for path in files:  # before anything is created on the server
        if not path.is_file():
            raise FileNotFoundError(f"--file {path}: no such file")
    conversation = (
        paw.conversation(args.conversation) if args.conversation else paw.new_conversation()
    )
    out.note(f"conversation {conversation.id}")
    run: Run | None = None
    try:
        try:
            run = conversation.ask(
                args.prompt,
                provider=args.provider,
                model=args.model,
                datasources=args.datasource or None,
                files=files,
                on_approval=lambda approval: _ask_approval(approval, args, out),
                progress=lambda name, done, total: out.progress(f"upload {name}", done, total),
            )
        except BaseException:
            # A new conversation whose first run could not start (refused, unreadable
            # file, interrupted) is not left behind empty.
            if not args.conversation:
                with contextlib.suppress(PawError, ConnectionFailed):
                    conversation.delete()
            raise
        view = RunView()
        for event in run.events():
            _show(event, view, out)
        run.wait()
    except KeyboardInterrupt:
        if run is not None and not run.is_finished:
            run.cancel()
            out.note("cancelled")
        return EXIT_INTERRUPTED
    if out.tty:
        # The answer streamed as the last text; repeat it only if it did not.
        if not view.text.rstrip().endswith(run.answer.rstrip()):
            out.line(run.answer, stream=out.stdout)
        elif view.text and not view.text.endswith("\n"):
            out.line("", stream=out.stdout)
    else:
        if view.text and not view.text.endswith("\n"):
            out.line("", stream=out.stderr)
        if run.answer:
            out.stdout.write(run.answer.rstrip("\n") + "\n")
            out.stdout.flush()
    if args.download:
        folder = Path(args.download)
        folder.mkdir(parents=True, exist_ok=True)
        for artifact in run.artifacts:
            target = folder / artifact.path
            target.parent.mkdir(parents=True, exist_ok=True)
            conversation.download_artifact(
                artifact,
                target,
                progress=lambda done, total, p=artifact.path: out.progress(
                    f"download {p}", done, total
                ),
            )
            out.note(f"saved {target}")
    usage = f"{run.usage.total:,} tokens"
    if run.status != "done":
        first = run.errors[0] if run.errors else None
        code = first.code if first else run.status
        out.note(
            out.paint(f"run {run.status}: {code}", "31") + (f": {first.message}" if first else "")
        )
        return EXIT_RUN_FAILED
    out.note(out.paint(f"done · {usage}", "2"))
    return EXIT_OK


def cmd_conversations(args: argparse.Namespace, out: Output) -> int:
    for conversation in _client(args).conversations(limit=args.limit):
        when = (
            conversation.last_activity.strftime("%Y-%m-%d %H:%M")
            if conversation.last_activity
            else ""
        )
        out.stdout.write(f"{conversation.id}\t{when}\t{conversation.title}\n")
    return EXIT_OK


def cmd_files(args: argparse.Namespace, out: Output) -> int:
    paw = _client(args)
    for item in paw.files(args.conversation):
        out.stdout.write(f"upload\t{item.size}\t{item.name}\n")
    for artifact in paw.artifacts(args.conversation):
        out.stdout.write(f"artifact\t{artifact.size}\t{artifact.path}\n")
    return EXIT_OK


def cmd_download(args: argparse.Namespace, out: Output) -> int:
    paw = _client(args)
    folder = Path(args.output)
    uploads = {f.name: f for f in paw.files(args.conversation)}
    for path in args.paths:
        target = folder / path
        target.parent.mkdir(parents=True, exist_ok=True)
        report = lambda done, total, p=path: out.progress(f"download {p}", done, total)  # noqa: E731
        if path in uploads:
            paw.download_file(args.conversation, uploads[path].id, target, progress=report)
        else:
            paw.download_artifact(args.conversation, path, target, progress=report)
        out.note(f"saved {target}")
    return EXIT_OK


def cmd_usage(args: argparse.Namespace, out: Output) -> int:
    report = _client(args).usage(from_=args.from_, to=args.to)
    totals, budget = report.totals, report.budget
    out.stdout.write(
        f"{report.from_} to {report.to}: {totals.get('tokens', 0):,} tokens "
        f"({totals.get('input_tokens', 0):,} in, {totals.get('output_tokens', 0):,} out) "
        f"in {totals.get('runs', 0)} runs\n"
    )
    limit = budget.get("monthly_limit") or 0
    used = budget.get("used_this_month", 0)
    out.stdout.write(
        f"this month: {used:,} of {limit:,} tokens\n"
        if limit
        else f"this month: {used:,} tokens (no limit)\n"
    )
    return EXIT_OK


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="paw", description="PAW from the terminal.")
    top.add_argument(
        "--url",
        default=None,
        help="PAW's address (default: PAW_URL, the stored one, or %(default)s)",
    )
    top.add_argument("--token", default=None, help="a personal API token (default: PAW_TOKEN)")
    commands = top.add_subparsers(dest="command", required=True)

    login = commands.add_parser("login", help="sign in and store a refresh token (0600)")
    login.add_argument("--username")
    login.add_argument("--password-stdin", action="store_true", help="read the password from stdin")
    login.set_defaults(handler=cmd_login)
    commands.add_parser("logout", help="forget the stored credentials").set_defaults(
        handler=cmd_logout
    )

    ask = commands.add_parser("ask", help="ask the agent; its work streams live")
    ask.add_argument("prompt")
    ask.add_argument("--file", "-f", action="append", help="upload a file first (repeatable)")
    ask.add_argument("--conversation", "-c", help="go on in this conversation (default: a new one)")
    ask.add_argument("--provider")
    ask.add_argument("--model")
    ask.add_argument("--datasource", "-d", action="append", help="a datasource slug (repeatable)")
    ask.add_argument("--download", metavar="DIR", help="save what the run made into DIR")
    decide = ask.add_mutually_exclusive_group()
    decide.add_argument("--yes", "-y", action="store_true", help="approve every risky action")
    decide.add_argument("--no", "-n", action="store_true", help="decline every risky action")
    ask.set_defaults(handler=cmd_ask)

    listing = commands.add_parser("conversations", help="your conversations, newest first")
    listing.add_argument("--limit", type=int, default=50)
    listing.set_defaults(handler=cmd_conversations)

    files = commands.add_parser("files", help="a conversation's uploads and artifacts")
    files.add_argument("conversation")
    files.set_defaults(handler=cmd_files)

    download = commands.add_parser("download", help="download uploads or artifacts")
    download.add_argument("conversation")
    download.add_argument("paths", nargs="+")
    download.add_argument("--output", "-o", default=".", help="folder (default: here)")
    download.set_defaults(handler=cmd_download)

    usage = commands.add_parser("usage", help="tokens used and the budget")
    usage.add_argument("--from", dest="from_")
    usage.add_argument("--to")
    usage.set_defaults(handler=cmd_usage)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command; returns (and, as a console script, exits with) its exit code."""
    args = parser().parse_args(argv)
    args.url = (
        args.url or os.environ.get("PAW_URL") or load_config().get("default") or DEFAULT_URL
    ).rstrip("/")
    out = Output(sys.stdout, sys.stderr)
    try:
        return args.handler(args, out)
    except ConnectionFailed as error:
        out.note(f"paw: {error.code}: {error.detail}")
        return EXIT_UNREACHABLE
    except PawError as error:
        out.note(f"paw: {error.code}: {error.detail}")
        return EXIT_REFUSED
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except OSError as error:  # a --file that cannot be read, a folder that cannot be made
        out.note(f"paw: {error}")
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
