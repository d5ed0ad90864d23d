"""The IPython extension: ``%load_ext paw_client``, then

::

    %paw_connect http://127.0.0.1:8000      # token from PAW_TOKEN, or asks for a password
    %%agent [--new | --conversation ID] [--provider P] [--model M] [--datasource D]...
            [--df NAME]... [--file PATH]... [--auto-approve]
    average tip by day, and a chart

The cell body is the prompt. ``--df NAME`` uploads the notebook's DataFrame ``NAME`` as
``NAME.csv`` (``--df NAME.parquet`` as Parquet, which needs pyarrow); ``--file`` uploads a
file. The conversation is kept between cells unless ``--new``.

The agent's text streams into one output updated in place; tool calls are rows with
their status; the plan is a checklist. Approvals are asked in the cell: buttons when
ipywidgets and jupyter-ui-poll are installed, else an ``input()`` prompt; the deadline is
shown. ``--auto-approve`` approves this cell's confirms (questions are still asked). What
the run made is shown by type: images inline, CSV/XLSX as tables (DataFrames), Plotly
figures (``*.plotly.json``) interactive, anything else saved under ``paw_artifacts/`` with
a link. When the run's result ran a verified example's SQL (PAW decides it: its
``result["verified"]``), "✓ verified query: <title>" is shown. The cell's value is an
:class:`AgentResult` (``.answer``, ``.artifacts``, ``.dataframe(name)``, ``.usage``), so
``_`` holds it in the next cell. Errors (budget, rate
limit, inactive provider …) are one line on stderr, not a traceback.
"""

from __future__ import annotations

import getpass
import html
import io
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import FileLink, Image, display

from paw_client.client import Client, Conversation, Run
from paw_client.errors import PawError
from paw_client.models import Approval, Artifact, Usage
from paw_client.view import RunView, plan_lines, verified_line

#: Seconds between two redraws of a streamed output (the last state is always drawn).
REDRAW_SECONDS = 0.1
IMAGE_FORMATS = {".png": "png", ".jpg": "jpeg", ".jpeg": "jpeg", ".gif": "gif", ".webp": "webp"}
#: Largest artifact shown inline (bytes); bigger ones get a link.
INLINE_MAX_BYTES = 20 * 1024 * 1024


class AgentResult:
    """What a ``%%agent`` cell gives back: ``answer`` (str), ``artifacts``
    (:class:`paw_client.Artifact`, what the run made), ``usage``
    (:class:`paw_client.Usage`), ``run`` and ``conversation``."""

    def __init__(self, run: Run, conversation: Conversation) -> None:
        self.run = run
        self.conversation = conversation
        self.answer: str = run.answer
        self.artifacts: list[Artifact] = list(run.artifacts)
        self.usage: Usage = run.usage
        self._bytes: dict[str, bytes] = {}

    def __repr__(self) -> str:
        names = ", ".join(a.path for a in self.artifacts) or "no files"
        return f"<AgentResult {self.run.status}: {names}; {self.usage.total:,} tokens>"

    def file(self, name: str) -> bytes:
        """The bytes of an artifact, by path or file name (downloaded once)."""
        artifact = self._artifact(name)
        if artifact.path not in self._bytes:
            data = self.conversation.download_artifact(artifact)
            assert isinstance(data, bytes)
            self._bytes[artifact.path] = data
        return self._bytes[artifact.path]

    def dataframe(self, name: str) -> Any:
        """A CSV, XLSX or Parquet artifact as a pandas DataFrame (by path or file name).
        Raises ``KeyError`` when the run made no such file."""
        return _read_table(self._artifact(name).path, self.file(name))

    def _artifact(self, name: str) -> Artifact:
        for artifact in self.artifacts:
            if name in (artifact.path, artifact.name):
                return artifact
        raise KeyError(f"the run made no {name!r}; it made {[a.path for a in self.artifacts]}")


def _read_table(path: str, data: bytes) -> Any:
    import pandas as pd

    suffix = Path(path).suffix.lower()
    if suffix == ".csv":
        return pd.read_csv(io.BytesIO(data))
    if suffix in (".xlsx", ".xls"):
        return pd.read_excel(io.BytesIO(data))
    if suffix == ".parquet":
        return pd.read_parquet(io.BytesIO(data))
    raise ValueError(f"{path} is not a table (CSV, XLSX or Parquet)")


class _Redrawn:
    """One output of the cell, drawn once and then updated in place (``display_id``)."""

    def __init__(self) -> None:
        self._handle: Any = None
        self._drawn_at = 0.0
        self._pending: dict[str, str] | None = None

    def draw(self, bundle: dict[str, str], *, now: bool = False) -> None:
        self._pending = bundle
        if now or time.monotonic() - self._drawn_at >= REDRAW_SECONDS:
            self.flush()

    def flush(self) -> None:
        if self._pending is None:
            return
        if self._handle is None:
            self._handle = display(self._pending, raw=True, display_id=True)
        else:
            self._handle.update(self._pending, raw=True)
        self._pending = None
        self._drawn_at = time.monotonic()


class _CellView:
    """The live outputs of one ``%%agent`` cell: text, tool rows, plan, notices."""

    def __init__(self) -> None:
        self.view = RunView()
        self.text, self.tools, self.plan = _Redrawn(), _Redrawn(), _Redrawn()

    def feed(self, event: Any) -> None:
        change = self.view.feed(event)
        if change == "text":
            self.text.draw({"text/plain": self.view.text, "text/markdown": self.view.text})
        elif change in ("tool", "tool_done"):
            self.text.flush()  # the text before the call shows before its row
            self.tools.draw(self._tool_bundle(), now=True)
        elif change == "plan":
            lines = plan_lines(self.view.plan)
            items = "".join(f"<li>{html.escape(line)}</li>" for line in lines)
            self.plan.draw(
                {"text/plain": "\n".join(lines), "text/html": f"<ul>{items}</ul>"}, now=True
            )
        elif change == "notice":
            print(self.view.notices[-1], file=sys.stderr)

    def _tool_bundle(self) -> dict[str, str]:
        rows = self.view.tools
        plain = "\n".join(f"{r.label}  [{r.status}]" for r in rows)
        cells = "".join(
            f"<tr><td><code>{html.escape(r.label)}</code></td><td>{html.escape(r.status)}</td>"
            f"<td>{html.escape(r.summary)}</td></tr>"
            for r in rows
        )
        return {"text/plain": plain, "text/html": f"<table class='paw-tools'>{cells}</table>"}

    def finish(self) -> None:
        for output in (self.text, self.tools, self.plan):
            output.flush()


def _deadline(approval: Approval) -> str:
    if approval.expires is None:
        return ""
    left = max(0, int(approval.seconds_left() or 0))
    return f" (answer by {approval.expires.astimezone().strftime('%H:%M:%S')}, {left} s left)"


def _decide_with_input(approval: Approval) -> bool | list[str]:
    """Ask at an ``input()`` prompt: ``y`` approves a confirm; a question takes an option
    number or text (empty: "Unanswered")."""
    if approval.kind == "confirm":
        reply = input(f"The agent wants to: {approval.prompt}{_deadline(approval)} Approve? [y/N] ")
        return reply.strip().lower() in ("y", "yes")
    answers = []
    for index, question in enumerate(approval.questions):
        options = approval.options(index)
        listed = "; ".join(f"{n}. {o}" for n, o in enumerate(options, 1))
        reply = input(f"{question.get('question', '')} {listed}{_deadline(approval)} ").strip()
        if reply.isdigit() and 1 <= int(reply) <= len(options):
            reply = options[int(reply) - 1]
        answers.append(reply or "Unanswered")
    return answers


def _decide_with_buttons(approval: Approval) -> bool | list[str] | None:
    """Buttons in the cell (ipywidgets), waited for with jupyter-ui-poll; ``None`` when
    either is missing (the caller falls back to ``input()``)."""
    try:
        import ipywidgets as widgets
        from jupyter_ui_poll import ui_events
    except ImportError:
        return None
    chosen: list[Any] = []
    text = approval.prompt or "; ".join(q.get("question", "") for q in approval.questions)
    label = widgets.HTML(
        f"<b>The agent asks:</b> {html.escape(text)}{html.escape(_deadline(approval))}"
    )
    if approval.kind == "confirm":
        buttons = [
            widgets.Button(description="Approve", button_style="success"),
            widgets.Button(description="Decline", button_style="danger"),
        ]
        buttons[0].on_click(lambda _: chosen.append(True))
        buttons[1].on_click(lambda _: chosen.append(False))
        box = widgets.VBox([label, widgets.HBox(buttons)])
    else:
        options = approval.options(0)
        buttons = [widgets.Button(description=o) for o in options]
        for button, option in zip(buttons, options, strict=True):
            button.on_click(lambda _, o=option: chosen.append([o]))
        field = widgets.Text(placeholder="or type an answer")
        field.on_submit(lambda w: chosen.append([w.value or "Unanswered"]))
        box = widgets.VBox([label, widgets.HBox(buttons), field])
    display(box)
    with ui_events() as poll:
        while not chosen and (approval.seconds_left() or 1) > 0:
            poll(10)
            time.sleep(0.05)
    box.close()
    return chosen[0] if chosen else None


def _show_artifact(conversation: Conversation, artifact: Artifact) -> None:
    """Display one artifact by its type (see the module doc)."""
    suffix = Path(artifact.path).suffix.lower()
    name = artifact.path.lower()
    small = artifact.size <= INLINE_MAX_BYTES
    if small and suffix in IMAGE_FORMATS:
        data = conversation.download_artifact(artifact)
        display(
            Image(data=data, format=IMAGE_FORMATS[suffix]), metadata={"paw_artifact": artifact.path}
        )
        return
    if small and suffix in (".csv", ".xlsx", ".xls", ".parquet"):
        try:
            table = _read_table(artifact.path, conversation.download_artifact(artifact))
        except Exception as error:  # an unreadable table still gets its link below
            print(f"{artifact.path}: not readable as a table ({error})", file=sys.stderr)
        else:
            display(
                {"text/markdown": f"**{artifact.path}**", "text/plain": artifact.path}, raw=True
            )
            display(table)
            return
    if small and name.endswith(".plotly.json"):
        figure = json.loads(conversation.download_artifact(artifact))
        display(
            {
                "application/vnd.plotly.v1+json": figure,
                "text/plain": f"<Plotly figure {artifact.path}>",
            },
            raw=True,
        )
        return
    folder = Path("paw_artifacts") / conversation.id
    target = folder / artifact.path
    target.parent.mkdir(parents=True, exist_ok=True)
    conversation.download_artifact(artifact, target)
    display(FileLink(str(target), result_html_prefix=f"{html.escape(artifact.path)}: "))


@magics_class
class PawMagics(Magics):
    """``%paw_connect`` and ``%%agent`` (see the module doc)."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.client: Client | None = None
        self.conversation: Conversation | None = None

    @magic_arguments()
    @argument("url", nargs="?", default=None, help="PAW's address (default: PAW_URL)")
    @argument("--token", default=None, help="a personal API token (default: PAW_TOKEN)")
    @argument("--username", default=None)
    @line_magic
    def paw_connect(self, line: str) -> None:
        """Connect to PAW: a token from ``--token`` or ``PAW_TOKEN``, else a username and a
        password asked for here (never stored)."""
        args = parse_argstring(self.paw_connect, line)
        url = args.url or os.environ.get("PAW_URL") or "http://127.0.0.1:8000"
        token = args.token or os.environ.get("PAW_TOKEN")
        try:
            if token:
                client = Client(url, token=token)
            else:
                username = args.username or input("PAW username: ").strip()
                client = Client(url, username=username, password=getpass.getpass("PAW password: "))
            me = client.me()
        except PawError as error:
            _one_line(error)
            return
        self.client, self.conversation = client, None
        print(f"Connected to {url} as {me.username}.")

    @magic_arguments()
    @argument("--new", action="store_true", help="start a new conversation")
    @argument("--conversation", default=None, help="go on in this conversation")
    @argument("--provider", default=None)
    @argument("--model", default=None)
    @argument("--datasource", action="append", default=[], help="a datasource slug (repeatable)")
    @argument(
        "--df",
        action="append",
        default=[],
        help="upload the DataFrame NAME (NAME.csv / NAME.parquet)",
    )
    @argument("--file", action="append", default=[], help="upload a file (repeatable)")
    @argument("--auto-approve", action="store_true", help="approve this cell's risky actions")
    @cell_magic
    def agent(self, line: str, cell: str) -> AgentResult | None:
        """Ask the agent the cell's text (see the module doc)."""
        args = parse_argstring(self.agent, line)
        prompt = cell.strip()
        if self.client is None:
            print("PAW: not connected: run %paw_connect URL first.", file=sys.stderr)
            return None
        if not prompt:
            print("PAW: the cell is empty: write the question below %%agent.", file=sys.stderr)
            return None
        try:
            uploads = [self._frame_upload(name) for name in args.df] + [Path(f) for f in args.file]
            conversation = self._conversation(args)
            cell_view = _CellView()

            def on_approval(approval: Approval) -> bool | list[str]:
                cell_view.finish()
                if args.auto_approve and approval.kind == "confirm":
                    print(f"auto-approved: {approval.prompt}")
                    return True
                decision = _decide_with_buttons(approval)
                return _decide_with_input(approval) if decision is None else decision

            run = conversation.ask(
                prompt,
                provider=args.provider,
                model=args.model,
                datasources=args.datasource or None,
                files=uploads,
                on_approval=on_approval,
            )
            for event in run.events():
                cell_view.feed(event)
            cell_view.finish()
            run.wait()
            verified = verified_line(run.result)
            if verified is not None:
                note = html.escape(verified)
                display(
                    {"text/plain": verified, "text/html": f"<p class='paw-verified'>{note}</p>"},
                    raw=True,
                )
            for artifact in run.artifacts:
                _show_artifact(conversation, artifact)
        except PawError as error:
            _one_line(error)
            return None
        except KeyError as error:  # a --df name that is not in the notebook
            print(f"PAW: {error.args[0]}", file=sys.stderr)
            return None
        if run.status != "done":
            first = run.errors[0] if run.errors else None
            detail = f"{first.code}: {first.message}" if first else run.status
            print(f"PAW: the run ended {run.status}: {detail}", file=sys.stderr)
        return AgentResult(run, conversation)

    def _conversation(self, args: Any) -> Conversation:
        assert self.client is not None
        if args.conversation:
            self.conversation = self.client.conversation(args.conversation)
        elif args.new or self.conversation is None:
            self.conversation = self.client.new_conversation()
        return self.conversation

    def _frame_upload(self, spec: str) -> tuple[str, bytes]:
        """``(file name, bytes)`` of the notebook's DataFrame ``NAME`` (CSV) or
        ``NAME.parquet``. Raises ``KeyError`` naming what is missing."""
        name, _, kind = spec.partition(".")
        frame = self.shell.user_ns.get(name) if self.shell is not None else None
        if frame is None or not hasattr(frame, "to_csv"):
            raise KeyError(f"--df {name}: no DataFrame named {name!r} in the notebook")
        import pandas as pd

        keep_index = not isinstance(frame.index, pd.RangeIndex)
        if kind == "parquet":
            buffer = io.BytesIO()
            frame.to_parquet(buffer, index=keep_index)
            return f"{name}.parquet", buffer.getvalue()
        return f"{name}.csv", frame.to_csv(index=keep_index).encode()


def _one_line(error: PawError) -> None:
    """A PAW error as one readable line on stderr (no traceback)."""
    extra = ""
    if getattr(error, "retry_after", None):
        extra = f" (retry in {error.retry_after:g} s)"
    print(f"PAW: {error.code}: {error.detail}{extra}", file=sys.stderr)
