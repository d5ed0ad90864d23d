"""The IPython extension: ``%load_ext paw_client``, then

::

    %paw_connect http://127.0.0.1:8000      # token from PAW_TOKEN, or asks for a password
    %%agent [--new | --conversation ID] [--provider P] [--model M] [--datasource D]...
            [--df NAME]... [--file PATH]... [--auto-approve] [--out NAME] [--no-interpolate]
    average tip by day in {tips}, and a chart

    %agent fix [--new | --conversation ID] [--provider P] [--model M] [--out NAME]

The cell body is the prompt. ``{name}`` in it is replaced by the notebook variable
``name`` (``{name.attr}`` by its public attribute): a DataFrame by its shape, columns and
first rows, a string as it is, anything else by a bounded ``repr`` (:func:`interpolate`);
braces that name no variable (``{"a": 1}``, ``{x for x in y}``, ``{{literal}}``,
``{undefined}``) are sent as written, and ``--no-interpolate`` sends the whole cell as
written. ``--df NAME`` uploads the notebook's DataFrame ``NAME`` as ``NAME.csv``
(``--df NAME.parquet`` as Parquet, which needs pyarrow); ``--file`` uploads a file. The
conversation is kept between cells unless ``--new``.

``%agent fix`` sends the notebook's last exception (the cells of its traceback and the
traceback, bounded: :func:`last_failure`) and asks for an explanation and the corrected
cell, which is put into the next cell (``set_next_input``) and printed.

The agent's text streams into one output updated in place; tool calls are rows with
their status; the plan is a checklist. Approvals are asked in the cell: buttons when
ipywidgets and jupyter-ui-poll are installed, else an ``input()`` prompt; the deadline is
shown. ``--auto-approve`` approves this cell's confirms (questions are still asked). What
the run made is shown by type: images inline, CSV/XLSX as tables (DataFrames), Plotly
figures (``*.plotly.json``) interactive, anything else saved under ``paw_artifacts/`` with
a link. When the run's result ran a verified example's SQL (PAW decides it: its
``result["verified"]``), "✓ verified query: <title>" is shown. A last output says what
the answer rests on ("Based on: …", its SQL, the run) and carries it as output metadata
``{"paw": {"conversation", "run", "sql", "lineage"}}``.
The cell's value is an :class:`AgentResult` (``.answer``, ``.artifacts``,
``.dataframe(name)``, ``.usage``, ``.sql``, ``.lineage``), so ``_`` holds it in the next
cell, and so does ``NAME`` with ``--out NAME``. Errors (budget, rate limit, inactive
provider …) are one line on stderr, not a traceback.
"""

from __future__ import annotations

import getpass
import html
import io
import json
import keyword
import linecache
import os
import re
import reprlib
import sys
import time
import traceback
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import IPython
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
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
#: Rows of a DataFrame that ``{name}`` puts into a prompt (as paw-agent previews an upload).
FRAME_ROWS = 20
#: Columns of a DataFrame that ``{name}`` shows (the others are elided with ``...``).
FRAME_COLUMNS = 30
#: Most characters that one ``{name}`` puts into a prompt.
VALUE_MAX_CHARS = 4_000
#: Most characters of the cells that ``%agent fix`` sends, all together.
CELL_MAX_CHARS = 20_000
#: Most characters of the traceback that ``%agent fix`` sends (its start and its end).
TRACEBACK_MAX_CHARS = 8_000


class AgentResult:
    """What a ``%%agent`` cell (or ``%agent fix``) gives back: ``answer`` (str),
    ``artifacts`` (:class:`paw_client.Artifact`, what the run made), ``usage``
    (:class:`paw_client.Usage`), ``run``, ``conversation``, ``sql`` (list of str),
    ``lineage`` (dict or None) and ``corrected_cell`` (``%agent fix``: str or None).
    ``sql`` is given by the cell (the statements its events showed); the rest is read
    from ``run``."""

    def __init__(
        self, run: Run, conversation: Conversation, *, sql: list[str] | None = None
    ) -> None:
        self.run = run
        self.conversation = conversation
        self.answer: str = run.answer
        self.artifacts: list[Artifact] = list(run.artifacts)
        self.usage: Usage = run.usage
        result = run.result if isinstance(run.result, dict) else {}
        #: The statements the answer rests on: those of the run's ``run_sql`` calls that
        #: returned rows (``sql``, from its events), and the run's ``result["sql"]``.
        self.sql: list[str] = list(sql or [])
        if isinstance(result.get("sql"), str) and result["sql"] and result["sql"] not in self.sql:
            self.sql.append(result["sql"])
        #: The run's ``result["lineage"]`` (``{"datasources", "entries", "tables",
        #: "columns"}``), or None when PAW recorded none.
        self.lineage: dict[str, Any] | None = (
            result["lineage"] if isinstance(result.get("lineage"), dict) else None
        )
        #: ``%agent fix``: the corrected cell of the answer (None without one or elsewhere).
        self.corrected_cell: str | None = None
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


#: ``{name}`` or ``{name.attr.attr}`` not inside doubled braces (``{{literal}}``).
_PLACEHOLDER = re.compile(r"(?<!\{)\{([^\W\d]\w*(?:\.[^\W\d]\w*)*)\}(?!\})")


def _bounded_repr() -> reprlib.Repr:
    """A ``repr`` that stops early on big containers and cuts long reprs (``reprlib``)."""
    bounded = reprlib.Repr()
    for name in ("maxtuple", "maxlist", "maxarray", "maxdict", "maxset", "maxfrozenset"):
        setattr(bounded, name, 50)
    bounded.maxdeque = 50
    bounded.maxlevel = 4
    bounded.maxstring = bounded.maxother = VALUE_MAX_CHARS
    bounded.maxlong = 200
    return bounded


_REPR = _bounded_repr()


def _cut(text: str, limit: int) -> str:
    """``text`` cut at ``limit`` characters, saying how many were left out."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… [{len(text) - limit:,} more characters]"


def _is_frame(value: Any) -> bool:
    """Whether ``value`` is a pandas DataFrame (without importing pandas: an object can
    only be one when pandas is already imported)."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(value, pandas.DataFrame)


def describe_frame(frame: Any, *, rows: int = FRAME_ROWS) -> str:
    """A DataFrame as the agent sees an uploaded table (paw-agent's preview):
    ``N rows x M columns``, the columns with their dtypes, and the first ``rows`` rows
    (of at most :data:`FRAME_COLUMNS` columns, the others elided; cells cut at 50
    characters)."""
    dtypes = list(frame.dtypes.items())
    columns = ", ".join(f"{name} ({dtype})" for name, dtype in dtypes[:FRAME_COLUMNS])
    if len(dtypes) > FRAME_COLUMNS:
        columns += f", … {len(dtypes) - FRAME_COLUMNS} more"
    table = frame.head(rows).to_string(max_cols=FRAME_COLUMNS, max_colwidth=50)
    return (
        f"{len(frame)} rows x {len(frame.columns)} columns\ncolumns: {columns}\n\n"
        f"first rows:\n{table}"
    )


def render_value(name: str, value: Any) -> str | None:
    """What ``{name}`` becomes in a prompt: a DataFrame as :func:`describe_frame` in a
    fenced block, a ``str`` as it is, anything else as a bounded ``repr`` (``reprlib``:
    50 items of a container, 4 levels deep; an object whose ``repr`` raises is
    ``<Type instance at 0x…>``), fenced when it has several lines; each cut at
    :data:`VALUE_MAX_CHARS` characters. None when it cannot be shown at all."""
    if _is_frame(value):
        try:
            text = describe_frame(value)
        except Exception:  # a frame pandas cannot print: left as written
            return None
        return f"\n```text\nDataFrame {name}: {_cut(text, VALUE_MAX_CHARS)}\n```\n"
    if isinstance(value, str):
        return _cut(value, VALUE_MAX_CHARS)
    try:
        text = _cut(_REPR.repr(value), VALUE_MAX_CHARS)
    except Exception:  # reprlib catches a failing __repr__; anything else: as written
        return None
    return f"\n```text\n{text}\n```\n" if "\n" in text else text


def interpolate(prompt: str, namespace: Mapping[str, Any], *, hidden: Container[str] = ()) -> str:
    """``prompt`` with its placeholders filled.

    A placeholder is ``{name}`` or ``{name.attr…}`` where ``name`` is a variable of
    ``namespace`` (the notebook's ``user_ns``) not in ``hidden`` (IPython's own ``In``,
    ``Out`` …) and no part starts with ``_``; it becomes :func:`render_value` of the
    value (attributes looked up with ``getattr``). Anything else in braces is left as
    written: literals and comprehensions (``{"a": 1}``, ``{x for x in y}``), doubled
    braces (``{{name}}``), names of no variable or a keyword, an attribute that is
    missing or whose lookup raises, conversions and format specs (``{n!r}``, ``{n:>4}``).
    No ``str.format``: nothing is evaluated but the attribute lookups (and the
    ``repr``)."""

    def fill(match: re.Match[str]) -> str:
        path = match.group(1).split(".")
        if (
            any(part.startswith("_") or keyword.iskeyword(part) for part in path)
            or path[0] in hidden
            or path[0] not in namespace
        ):
            return match.group(0)
        value = namespace[path[0]]
        for attribute in path[1:]:
            try:
                value = getattr(value, attribute)
            except Exception:  # a missing attribute, or a property that raised
                return match.group(0)
        text = render_value(match.group(1), value)
        return match.group(0) if text is None else text

    return _PLACEHOLDER.sub(fill, prompt)


@dataclass
class Failure:
    """The notebook's last exception, as ``%agent fix`` sends it: ``exception``;
    ``cells``, the ``(label, source)`` of each cell in its traceback, the cell that ran
    first (label ``In[5]``, or the file name when IPython cannot number it; the raw
    source as typed); and ``traceback``, formatted without IPython's own frames, cells
    named ``Cell In[5]``, cut to :data:`TRACEBACK_MAX_CHARS`."""

    exception: BaseException
    cells: list[tuple[str, str]] = field(default_factory=list)
    traceback: str = ""


def _cell_number(shell: Any, filename: str) -> int | None:
    """The execution count of the cell IPython compiled as ``filename``, or None."""
    label = getattr(getattr(shell, "compile", None), "format_code_name", lambda _: None)(filename)
    found = re.fullmatch(r"In\[(\d+)\]", label[1]) if label else None
    return int(found.group(1)) if found else None


def _cell_source(shell: Any, number: int | None, filename: str) -> str:
    """Cell ``number``'s raw source (the input history), else the compiled code IPython
    left in ``linecache`` for ``filename``."""
    history = getattr(getattr(shell, "history_manager", None), "input_hist_raw", [])
    if number is not None and 0 < number < len(history):
        return str(history[number])
    return "".join(linecache.getlines(filename))


def _cut_middle(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters: its first quarter and its last three (a
    traceback's end, the exception and the innermost frames, matters most)."""
    if len(text) <= limit:
        return text
    head, tail = limit // 4, limit - limit // 4
    return f"{text[:head]}\n[… {len(text) - limit:,} characters left out …]\n{text[-tail:]}"


def last_failure(shell: Any) -> Failure | None:
    """The notebook's last exception (``sys.last_exc`` / ``sys.last_value``, which
    IPython sets whenever it shows one), or None before any.

    The traceback starts below IPython's own frames (those that ran the cell); the
    cells are those of its frames (a ``SyntaxError``'s own file first), each once, their
    sources cut to :data:`CELL_MAX_CHARS` in all."""
    exception = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if not isinstance(exception, BaseException):
        return None
    formatted = traceback.TracebackException.from_exception(exception)
    frames = list(formatted.stack)
    filenames = [frame.filename for frame in frames]
    chained, seen = formatted.__cause__ or formatted.__context__, 0
    while chained is not None and seen < 50:  # the exceptions it was raised from or during
        filenames += [frame.filename for frame in chained.stack]
        chained, seen = chained.__cause__ or chained.__context__, seen + 1
    if isinstance(exception, SyntaxError) and exception.filename:
        filenames.insert(0, exception.filename)
    names: dict[str, int | None] = {}
    for filename in filenames:
        if filename in names:
            continue
        number = _cell_number(shell, filename)
        if number is not None or filename.startswith("<ipython-input-"):
            names[filename] = number
    own = str(Path(IPython.__file__).parent)
    first = next((i for i, f in enumerate(frames) if not f.filename.startswith(own)), len(frames))
    if first:
        formatted.stack = traceback.StackSummary.from_list(frames[first:])
    text = "".join(formatted.format())
    cells, budget = [], CELL_MAX_CHARS
    for filename, number in names.items():
        label = f"In[{number}]" if number is not None else filename
        text = text.replace(f'File "{filename}"', f"Cell {label}")
        source = _cut(_cell_source(shell, number, filename), max(budget, 0))
        budget -= len(source)
        cells.append((label, source))
    return Failure(exception, cells, _cut_middle(text, TRACEBACK_MAX_CHARS))


def fix_prompt(failure: Failure) -> str:
    """What ``%agent fix`` asks: the cells and the traceback of ``failure``, and for an
    explanation and the corrected cell as one ``python`` code block."""
    parts = [
        "A cell of my Jupyter notebook raised an exception. It ran in my notebook's "
        "kernel, not in your workspace."
    ]
    for index, (label, source) in enumerate(failure.cells):
        role = "The cell that raised it" if index == 0 else "Also in the traceback"
        parts.append(f"{role}, {label}:\n```python\n{source.rstrip()}\n```")
    if not failure.cells:
        parts.append("(Its cell is not known: only the traceback.)")
    parts.append(f"The traceback:\n```text\n{failure.traceback.rstrip()}\n```")
    parts.append(
        "Explain briefly what went wrong, then give the corrected cell, complete, as one "
        "```python code block (the one cell to change, ready to run in its place)."
    )
    return "\n\n".join(parts)


#: The languages of a fenced block that can be a corrected cell ("": untagged).
CELL_LANGUAGES = frozenset({"", "python", "python3", "py", "ipython", "ipython3"})


def _fenced_blocks(text: str) -> list[tuple[str, str]]:
    """The ```` ``` ```` fenced blocks of Markdown ``text`` as ``(language, code)``, in
    order (an unclosed block runs to the end, as CommonMark has it)."""
    blocks: list[tuple[str, str]] = []
    language, lines = "", None
    for line in text.splitlines():
        stripped = line.strip()
        if lines is None:
            if stripped.startswith("```"):
                language, lines = stripped[3:].strip().split(" ")[0].lower(), []
        elif stripped.startswith("```") and not stripped.strip("`"):
            blocks.append((language, "\n".join(lines)))
            lines = None
        else:
            lines.append(line)
    if lines is not None:
        blocks.append((language, "\n".join(lines)))
    return blocks


def corrected_cell(answer: str) -> str | None:
    """The last Python (or untagged) fenced code block of ``answer``
    (:data:`CELL_LANGUAGES`), or None when it has none that holds code."""
    cells = [code for language, code in _fenced_blocks(answer) if language in CELL_LANGUAGES]
    return cells[-1].strip("\n") if cells and cells[-1].strip() else None


def based_on(lineage: dict[str, Any] | None) -> str:
    """ "Based on: ``orders``, ``customers``; doc *Revenue*" (Markdown) from a run's
    lineage: the tables its queries read, then the knowledge entries it was given other
    than schema entries (those are the tables); the datasources when it read no table.
    ``""`` for no lineage. Tolerates missing or odd fields (``lineage`` is the server's
    ``result["lineage"]``: ``{"datasources", "entries": [{"id", "kind", "title",
    "datasource", "source"}], "tables", "columns"}``)."""
    if not isinstance(lineage, dict):
        return ""

    def strings(key: str) -> list[str]:
        found = lineage.get(key)
        return (
            [str(v) for v in found if isinstance(v, str) and v] if isinstance(found, list) else []
        )

    tables = ", ".join(f"`{table}`" for table in strings("tables"))
    parts = [tables] if tables else []
    entries = lineage.get("entries") if isinstance(lineage.get("entries"), list) else []
    for entry in entries:
        if isinstance(entry, dict) and entry.get("kind") != "schema" and entry.get("title"):
            parts.append(f"{entry.get('kind') or 'entry'} *{entry['title']}*")
    if not tables:
        parts[:0] = [f"datasource `{slug}`" for slug in strings("datasources")]
    return "Based on: " + "; ".join(parts) if parts else ""


def _show_provenance(result: AgentResult) -> None:
    """The cell's last output: what the answer rests on (:func:`based_on`), its SQL and
    the run, with ``{"paw": {"conversation", "run", "sql", "lineage"}}`` as the output's
    metadata (saved in the notebook with the cell)."""
    ids = f"run {result.run.id} · conversation {result.conversation.id}"
    basis = based_on(result.lineage)
    markdown = [f"**{basis.replace('Based on:', 'Based on:**', 1)}" if basis else ""]
    plain = [basis.replace("`", "").replace("*", "")] if basis else []
    for statement in result.sql:
        markdown.append(f"```sql\n{statement}\n```")
        plain.append(statement)
    markdown.append(f"<sub>{html.escape(ids)}</sub>")
    plain.append(ids)
    metadata = {
        "paw": {
            "conversation": result.conversation.id,
            "run": result.run.id,
            "sql": result.sql,
            "lineage": result.lineage,
        }
    }
    display(
        {"text/plain": "\n".join(plain), "text/markdown": "\n\n".join(m for m in markdown if m)},
        raw=True,
        metadata=metadata,
    )


@magics_class
class PawMagics(Magics):
    """``%paw_connect``, ``%%agent`` and ``%agent fix`` (see the module doc)."""

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
    @argument(
        "--out", default=None, metavar="NAME", help="also keep the result in the variable NAME"
    )
    @argument("--no-interpolate", action="store_true", help="send {name} as written, not its value")
    @line_cell_magic
    def agent(self, line: str, cell: str | None = None) -> AgentResult | None:
        """``%%agent``: ask the agent the cell's text; ``%agent fix``: send the last
        exception and get the corrected cell (see the module doc)."""
        if cell is None:
            command, _, rest = line.strip().partition(" ")
            if command != "fix":
                print(
                    "PAW: %agent takes one command, fix (send the last exception); "
                    "ask a question in a %%agent cell.",
                    file=sys.stderr,
                )
                return None
            return self._fix(parse_argstring(self.agent, rest))
        args = parse_argstring(self.agent, line)
        prompt = cell.strip()
        if not self._ready(args):
            return None
        if not prompt:
            print("PAW: the cell is empty: write the question below %%agent.", file=sys.stderr)
            return None
        if not args.no_interpolate:
            prompt = interpolate(prompt, self.shell.user_ns, hidden=self.shell.user_ns_hidden)
        result = self._ask(args, prompt)
        if result is not None:
            self._finish(args, result)
        return result

    def _ready(self, args: Any) -> bool:
        """Whether the magic may send: connected, and ``--out`` a Python identifier (else
        one line on stderr)."""
        if self.client is None:
            print("PAW: not connected: run %paw_connect URL first.", file=sys.stderr)
            return False
        if args.out is not None and not (
            args.out.isidentifier() and not keyword.iskeyword(args.out)
        ):
            print(f"PAW: --out {args.out}: not a Python variable name.", file=sys.stderr)
            return False
        return True

    def _fix(self, args: Any) -> AgentResult | None:
        """``%agent fix``: the last exception's cells and traceback to the agent; the
        corrected cell of its answer into the next cell and printed."""
        if not self._ready(args):
            return None
        failure = last_failure(self.shell)
        if failure is None:
            print(
                "PAW: no exception yet in this notebook: %agent fix sends the last one.",
                file=sys.stderr,
            )
            return None
        result = self._ask(args, fix_prompt(failure))
        if result is None:
            return None
        result.corrected_cell = corrected_cell(result.answer)
        if result.corrected_cell is None:
            print("PAW: the answer has no corrected cell (no ```python block).", file=sys.stderr)
        else:
            self.shell.set_next_input(result.corrected_cell)
            print(f"The corrected cell (put into the next cell):\n\n{result.corrected_cell}")
        self._finish(args, result)
        return result

    def _finish(self, args: Any, result: AgentResult) -> None:
        """The cell's last output (:func:`_show_provenance`); ``--out NAME`` keeps it."""
        _show_provenance(result)
        if args.out is not None:
            self.shell.user_ns[args.out] = result

    def _ask(self, args: Any, prompt: str) -> AgentResult | None:
        """Run ``prompt`` with the cell's options, showing it live; None (and one line on
        stderr) when it could not start."""
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
        return AgentResult(run, conversation, sql=cell_view.view.sql)

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
