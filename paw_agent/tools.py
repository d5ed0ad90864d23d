"""The tools of the data agent, their JSON schemas, and the approval gate.

Every path goes through :class:`~paw_agent.workspace.Workspace`. ``shell``,
``delete_file``, ``install_package`` and any ``run_sql`` that is not read-only first ask
the user to confirm (a ``notify ask`` of kind ``confirm`` whose prompt says exactly what
will run) and do nothing unless approved; a declined or unanswered confirm returns
"declined by the user" to the model (issue 3).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import sqlite3
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paw_agent import procs
from paw_agent.control import RunControl
from paw_agent.images import DEFAULT_MAX_BYTES, ImageRefused, image_part
from paw_agent.kernel_client import KernelDied, KernelTimeout, PythonKernel
from paw_agent.knowledge import KINDS, MAX_LIMIT, Knowledge, format_entry
from paw_agent.precheck import CHECK_TIMEOUT, Check, explain_check, parse_refusal
from paw_agent.sql import ROW_CAP, Datasource, SqlError, run_query
from paw_agent.workspace import PRIVATE_DIR, PathRefused, Workspace

MAX_RESULT = 20_000  # characters of a tool result sent to the model
MAX_OUTPUT = 10_000  # characters of each of a tool's stdout, stderr, error shown to people
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".gif", ".webp", ".svg")
PLOTLY_SUFFIX = ".plotly.json"
MAX_READ = 20_000  # characters read_file returns by default
MAX_LIST = 500  # entries list_files returns
DECLINED = "declined by the user"
PLAN_STATUSES = ("pending", "in_progress", "completed")
MAX_PLAN_STEPS = 50
TABLE_SUFFIXES = (".csv", ".tsv", ".tab", ".xlsx", ".xlsm", ".xls")
# A PEP 508 name with extras and version specifiers, no URLs and no pip options.
REQUIREMENT = re.compile(
    r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?"
    r"(\s*(==|>=|<=|~=|!=|>|<)\s*[A-Za-z0-9.*+!_-]+(\s*,\s*(==|>=|<=|~=|!=|>|<)\s*"
    r"[A-Za-z0-9.*+!_-]+)*)?$"
)


class ToolError(Exception):
    """A tool that could not do its job; the message goes to the model as the result."""


@dataclass
class ToolOutcome:
    """What a tool call produced: ``text`` for the model, ``ok``, a one-line ``summary``
    for people (notify ``tool``), and ``notify``: more fields for that notify (``run_sql``:
    ``sql_result``, its rows as data, and ``sql_run``, what the statement did for the
    host's audit; ``run_python``: ``output``, ``files``, ``table``; ``search_knowledge``:
    ``entries``, ``[{"id", "datasource", "kind", "title"}]`` of what it found, for the
    host's lineage).
    :meth:`notify_fields` adds the output every tool shows to people. ``images``:
    ``(path, image content part)`` pairs the model is shown after the round's tool
    results (``view_image``)."""

    text: str
    ok: bool = True
    summary: str = ""
    notify: dict[str, Any] = field(default_factory=dict)
    images: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def notify_fields(self) -> dict[str, Any]:
        """The extra fields of this call's ``notify tool``: :attr:`notify`, with an
        ``output`` (``{"stdout", "stderr", "error"}``, each cut at :data:`MAX_OUTPUT`
        characters) made from :attr:`text` when the tool gave none (a failed call's text
        is its ``error``)."""
        fields = dict(self.notify)
        if "output" not in fields:
            fields["output"] = people_output(
                stdout=self.text if self.ok else "", error=None if self.ok else self.text
            )
        return fields


def people_output(*, stdout: str = "", stderr: str = "", error: str | None = None) -> dict:
    """A tool's output for people (``notify tool`` ``output``): ``{"stdout": str,
    "stderr": str, "error": str | None}``, each cut at :data:`MAX_OUTPUT` characters
    (the middle left out)."""
    return {
        "stdout": _cut(stdout or "", MAX_OUTPUT),
        "stderr": _cut(stderr or "", MAX_OUTPUT),
        "error": _cut(error, MAX_OUTPUT) if error else None,
    }


@dataclass
class SqlChecks:
    """The check before ``run_sql`` runs a statement (:mod:`paw_agent.precheck`), for one
    run: it may send ``retries`` statements back to the model (``--sql-retries``; 0: no
    check), and has sent ``refused`` back so far. Once none are :attr:`left`, statements
    run unchecked, as without the check."""

    retries: int
    refused: int = 0

    @property
    def left(self) -> int:
        """How many more statements the check may send back in this run."""
        return max(0, self.retries - self.refused)


@dataclass
class ToolContext:
    """What a tool may use during one run: its ``control`` (cancel, deadline), ``confirm``
    (prompt → approved?; raises ``Stopped`` on cancel), ``ask`` (questions → answer, or
    None when unanswered), ``notify`` (kind, data → a ``notify`` line for the host), the
    run's ``allowed`` tools and its ``knowledge``."""

    control: RunControl
    confirm: Callable[[str], bool]
    ask: Callable[[list[dict[str, Any]]], str | None]
    notify: Callable[[str, Any], None] = lambda kind, data: None
    #: The only tools this run may use (the submit's ``tools``), or None for all.
    allowed: frozenset[str] | None = None
    #: What PAW knows about the run's datasources (the submit's ``knowledge``).
    knowledge: Knowledge | None = None
    #: The model accepts images (the submit's ``vision``): ``view_image`` is offered.
    vision: bool = False
    #: Largest image ``view_image`` sends (bytes).
    max_image_bytes: int = DEFAULT_MAX_BYTES
    #: The run's check before ``run_sql`` runs a statement (None: no check).
    sql_checks: SqlChecks | None = None


def _schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def _function(name: str, description: str, parameters: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


PATH = {"type": "string", "description": "a path relative to the workspace"}
TIMEOUT = {"type": "number", "description": "time limit in seconds (optional)"}

SPECS = [
    _function(
        "list_files",
        "List the files of the workspace (or of one of its folders).",
        _schema(
            {
                "path": {**PATH, "description": "folder, default '.'"},
                "recursive": {"type": "boolean", "description": "include subfolders"},
            },
            [],
        ),
    ),
    _function(
        "read_file",
        "Read a text file. CSV, TSV and Excel files give a pandas preview "
        "(shape, columns, first rows); use run_python for the full data.",
        _schema(
            {"path": PATH, "max_chars": {"type": "integer", "description": "default 20000"}},
            ["path"],
        ),
    ),
    _function(
        "write_file",
        "Create or overwrite a text file in the workspace.",
        _schema({"path": PATH, "content": {"type": "string"}}, ["path", "content"]),
    ),
    _function(
        "run_python",
        "Run Python code in a persistent session in the workspace "
        "(variables survive between calls). pandas, openpyxl, matplotlib and plotly are "
        "available. Returns stdout, stderr and any traceback; the value of a final "
        "expression is printed (a DataFrame is also shown to the user as a table). "
        "Matplotlib figures not saved by the code are saved as PNG files; Plotly figures "
        "(fig.show(), or left as the final expression) as .plotly.json files, shown to "
        "the user as interactive charts. Write results the user wants (xlsx, csv, png) "
        "to the workspace.",
        _schema({"code": {"type": "string"}, "timeout": TIMEOUT}, ["code"]),
    ),
    _function(
        "view_image",
        "Look at an image of the workspace (PNG, JPEG or WebP: an upload, or a chart you "
        "saved): it is shown to you right after this call's result.",
        _schema({"path": PATH}, ["path"]),
    ),
    _function(
        "search_knowledge",
        "Search what PAW knows about the datasources: descriptions of their tables and "
        "views (columns, types, keys, row counts), operators' notes (business definitions, "
        "caveats) and example questions with the SQL that answers them. Use it before "
        "writing SQL about tables you were not told about.",
        _schema(
            {
                "query": {"type": "string", "description": "what you look for, in words"},
                "datasource": {"type": "string", "description": "only this datasource (slug)"},
                "kind": {"type": "string", "enum": list(KINDS), "description": "only this kind"},
                "limit": {
                    "type": "integer",
                    "description": f"entries, default 5, at most {MAX_LIMIT}",
                },
            },
            ["query"],
        ),
    ),
    _function(
        "run_sql",
        "Run one SQL statement on a datasource. Read-only queries (a single "
        "SELECT/WITH/EXPLAIN) run at once; anything else needs the user's approval. "
        f"At most {ROW_CAP} rows are returned, with the number of rows there are.",
        _schema(
            {
                "datasource": {"type": "string", "description": "the datasource slug"},
                "query": {"type": "string"},
            },
            ["datasource", "query"],
        ),
    ),
    _function(
        "shell",
        "Run a shell command (bash) in the workspace. Needs the user's approval each time.",
        _schema({"command": {"type": "string"}, "timeout": TIMEOUT}, ["command"]),
    ),
    _function(
        "delete_file",
        "Delete a file or a folder of the workspace. Needs the user's approval.",
        _schema({"path": PATH}, ["path"]),
    ),
    _function(
        "install_package",
        "Install a Python package (pip requirement such as "
        "'tabulate' or 'scipy>=1.11', or a wheel file in the workspace) for run_python. "
        "Needs the user's approval.",
        _schema({"package": {"type": "string"}}, ["package"]),
    ),
    _function(
        "ask_user",
        "Ask the user a question and wait for the answer. Use it only when "
        "you cannot go on without a decision.",
        _schema(
            {
                "question": {"type": "string"},
                "options": {
                    "type": "array",
                    "items": {"type": "string"},
                    "description": "suggested answers (optional)",
                },
            },
            ["question"],
        ),
    ),
    _function(
        "update_plan",
        "Show the user your plan for a task of several steps, and update it as you go: "
        "the whole list each time, each step with its status.",
        _schema(
            {
                "steps": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "properties": {
                            "content": {"type": "string", "description": "the step"},
                            "status": {
                                "type": "string",
                                "enum": list(PLAN_STATUSES),
                            },
                        },
                        "required": ["content", "status"],
                    },
                }
            },
            ["steps"],
        ),
    ),
]
GATED = ("shell", "delete_file", "install_package")


def arg_repr(value: Any, limit: int = 100) -> str:
    """``repr(value)`` cut to ``limit`` characters with an ellipsis (the short argument
    reprs of ``notify tool_calls``, as python-agent-harness writes them)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: Characters of one argument's full value shown to people (``tool_calls`` ``input``).
MAX_INPUT_CHARS = 20_000


def _parsed_args(arguments: str) -> dict[str, Any]:
    """A call's JSON ``arguments`` as a dict; ``{}`` when they are not a JSON object."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def full_args(arguments: str) -> dict[str, Any]:
    """A call's JSON ``arguments`` as given, for people to read what ran (the whole
    ``code`` of a ``run_python``): string values cut at ``MAX_INPUT_CHARS``, ``content``
    (a file's whole text) left out as in :func:`display_args`; ``{}`` when they are not a
    JSON object."""
    shown: dict[str, Any] = {}
    for key, value in _parsed_args(arguments).items():
        if key == "content":
            continue
        if isinstance(value, str) and len(value) > MAX_INPUT_CHARS:
            value = value[:MAX_INPUT_CHARS] + "…"
        shown[key] = value
    return shown


def display_args(arguments: str) -> dict[str, str]:
    """Short reprs of a call's JSON ``arguments``, without ``content`` (too large for a
    label); ``{}`` when they are not a JSON object."""
    return {
        key: arg_repr(value) for key, value in _parsed_args(arguments).items() if key != "content"
    }


def _cut(text: str, limit: int = MAX_RESULT) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n… [{len(text) - limit} characters omitted] …\n{text[-half:]}"


def _summary_line(text: str, limit: int = 120) -> str:
    """The last line of ``text`` (a traceback's exception, a query's row count), cut."""
    line = next((x.strip() for x in text.strip().splitlines()[-1:] if x.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _sql_run(
    began: float,
    *,
    row_count: int | None = None,
    error: str | None = None,
    explained: bool = False,
) -> dict:
    """What ``run_sql`` tells the host of a statement it sent to the database (``notify
    tool`` ``sql_run``, for PAW's audit): ``{"duration_ms": int (since ``began``, a
    ``time.monotonic()``), "row_count": rows returned or changed, or None, "error": None
    or the :class:`~paw_agent.sql.SqlError` code, "explained": an ``EXPLAIN`` of it was
    sent first (the check before running)}``."""
    return {
        "duration_ms": max(0, round((time.monotonic() - began) * 1000)),
        "row_count": row_count if row_count is None or row_count >= 0 else None,
        "error": error,
        "explained": explained,
    }


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} bytes"


class Toolbox:
    """The tools of one sandbox: its workspace, Python kernel, datasources (by slug),
    private package folder and per-call time limit ``tool_timeout`` (s)."""

    def __init__(
        self,
        *,
        workspace: Workspace,
        kernel: PythonKernel,
        datasources: list[Datasource],
        packages_dir: Path,
        tool_timeout: float,
        sql_result_rows: int = 100,
        sql_check_timeout: float = CHECK_TIMEOUT,
    ) -> None:
        self.workspace = workspace
        self.kernel = kernel
        self.datasources = {source.slug: source for source in datasources}
        self.packages_dir = packages_dir
        self.tool_timeout = tool_timeout
        self.sql_result_rows = sql_result_rows
        self.sql_check_timeout = sql_check_timeout

    @property
    def specs(self) -> list[dict[str, Any]]:
        """The tool definitions in the OpenAI ``tools`` format; ``run_sql`` only when there
        are datasources (``search_knowledge`` comes with a run's knowledge: :meth:`specs_for`)."""
        return [
            s
            for s in SPECS
            if s["function"]["name"] != "search_knowledge"
            and (self.datasources or s["function"]["name"] != "run_sql")
        ]

    def specs_for(self, context: ToolContext) -> list[dict[str, Any]]:
        """The tools of one run: :attr:`specs`, plus ``search_knowledge`` when the run has
        knowledge indexes, and only the run's ``allowed`` ones when it names them."""
        specs = [s for s in self.specs if context.vision or s["function"]["name"] != "view_image"]
        if context.knowledge is not None and context.knowledge.indexes:
            specs.insert(0, next(s for s in SPECS if s["function"]["name"] == "search_knowledge"))
        if context.allowed is not None:
            specs = [s for s in specs if s["function"]["name"] in context.allowed]
        return specs

    def run(self, name: str, arguments: str, context: ToolContext) -> ToolOutcome:
        """Run tool ``name`` with the model's JSON ``arguments``. Tool failures come back
        as an outcome with ``ok`` False (the model reads them); ``Stopped`` propagates. A
        tool the run does not offer (unknown, or not among its ``allowed`` ones) is refused
        without running."""
        method = getattr(self, f"tool_{name}", None)
        offered = self.specs_for(context)
        if method is None or name not in {s["function"]["name"] for s in offered}:
            known = ", ".join(s["function"]["name"] for s in offered)
            return ToolOutcome(
                f"error: unknown tool {name!r}; the tools are: {known}",
                ok=False,
                summary=f"unknown tool {name}",
            )
        try:
            args = json.loads(arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            return ToolOutcome(
                f"error: the arguments are not a valid JSON object ({exc})",
                ok=False,
                summary="invalid arguments",
            )
        try:
            outcome = method(args, context)
        except (ToolError, PathRefused, SqlError) as exc:
            return ToolOutcome(f"error: {exc}", ok=False, summary=_summary_line(str(exc)))
        except (TypeError, KeyError) as exc:
            return ToolOutcome(
                f"error: bad arguments for {name}: {exc}", ok=False, summary="bad arguments"
            )
        except OSError as exc:
            return ToolOutcome(
                f"error: {exc.strerror or exc}", ok=False, summary=str(exc.strerror or exc)
            )
        outcome.text = _cut(outcome.text)
        return outcome

    def _timeout(self, args: dict[str, Any], floor: float = 0.0) -> float:
        value = args.get("timeout")
        limit = max(self.tool_timeout, floor)
        if isinstance(value, int | float) and value > 0:
            return min(float(value), max(limit, 600.0))
        return limit

    # -- files ------------------------------------------------------------------------

    def tool_list_files(self, args: dict[str, Any], context: ToolContext) -> ToolOutcome:
        """Files and folders (``name/``) with sizes, hidden runtime files left out."""
        folder = self.workspace.resolve(args.get("path") or ".")
        if not folder.is_dir():
            raise ToolError(f"{args.get('path')!r} is not a folder")
        entries: list[str] = []
        pending = [folder]
        while pending and len(entries) < MAX_LIST:
            current = pending.pop(0)
            for item in sorted(current.iterdir(), key=lambda p: p.name):
                if item.name in (PRIVATE_DIR, "__pycache__"):
                    continue
                rel = (
                    self.workspace.relative(item)
                    if current != folder or args.get("recursive")
                    else item.name
                )
                if item.is_symlink():
                    # Never followed: a link may point outside the workspace.
                    entries.append(f"{rel}  (symlink)")
                elif item.is_dir():
                    entries.append(f"{rel}/")
                    if args.get("recursive"):
                        pending.append(item)
                else:
                    with contextlib.suppress(OSError):
                        entries.append(f"{rel}  ({_size(item.stat().st_size)})")
                if len(entries) >= MAX_LIST:
                    entries.append(f"… (stopped at {MAX_LIST} entries)")
                    break
        text = "\n".join(entries) if entries else "(empty folder)"
        return ToolOutcome(text, summary=f"{len(entries)} entries")

    def tool_view_image(self, args: dict[str, Any], context: ToolContext) -> ToolOutcome:
        """The image at ``path``, for the model to see (offered only to a model that
        accepts images)."""
        path = args["path"]
        try:
            part = image_part(self.workspace, path, context.max_image_bytes)
        except ImageRefused as exc:
            raise ToolError(str(exc)) from exc
        name = self.workspace.relative(self.workspace.resolve(path))
        size = self.workspace.resolve(path).stat().st_size
        return ToolOutcome(
            f"{name} ({_size(size)}) is shown to you in the next message.",
            summary=f"{name} shown to the model",
            images=[(name, part)],
        )

    def tool_read_file(self, args: dict[str, Any], context: ToolContext) -> ToolOutcome:
        """Text (capped), or a pandas preview of CSV/TSV/Excel, or a note for binaries."""
        path = self.workspace.resolve(args["path"])
        if path.is_dir():
            raise ToolError(f"{args['path']!r} is a folder; use list_files")
        if not path.exists():
            raise ToolError(f"no file {args['path']!r}")
        if path.suffix.lower() in TABLE_SUFFIXES:
            answer = self._kernel({"op": "preview", "path": str(path)}, self.tool_timeout, context)
            if answer.get("error"):
                raise ToolError(f"cannot read {args['path']} as a table: {answer['error']}")
            return ToolOutcome(answer["stdout"], summary=answer["stdout"].split("\n", 1)[0])
        size = path.stat().st_size
        with path.open("rb") as handle:
            head = handle.read(8192)
        if b"\x00" in head:
            return ToolOutcome(
                f"{args['path']} is a binary file ({_size(size)}); use run_python to work with it",
                summary="binary file",
            )
        limit = args.get("max_chars") if isinstance(args.get("max_chars"), int) else MAX_READ
        limit = max(1, min(limit, 100_000))
        with path.open("r", encoding="utf-8", errors="replace") as handle:
            text = handle.read(limit + 1)
        if len(text) > limit:
            text = text[:limit] + f"\n… [cut at {limit} characters; the file has {_size(size)}]"
        return ToolOutcome(text, summary=f"{_size(size)} read")

    def tool_write_file(self, args: dict[str, Any], context: ToolContext) -> ToolOutcome:
        """Write UTF-8 text, creating folders as needed."""
        path = self.workspace.resolve(args["path"])
        content = args["content"]
        if not isinstance(content, str):
            raise ToolError("content must be a string")
        if path.is_dir():
            raise ToolError(f"{args['path']!r} is a folder")
        path.parent.mkdir(parents=True, exist_ok=True)
        # Resolve again: a folder just created cannot be a symlink, but check the final
        # place before writing.
        path = self.workspace.resolve(self.workspace.relative(path))
        data = content.encode("utf-8")
        path.write_bytes(data)
        rel = self.workspace.relative(path)
        return ToolOutcome(
            f"wrote {len(data)} bytes to {rel}",
            summary=f"wrote {rel}",
            notify={
                "output": people_output(stdout=f"wrote {len(data)} bytes to {rel}"),
                "files": [rel],
            },
        )

    def tool_delete_file(self, args: dict[str, Any], context: ToolContext) -> ToolOutcome:
        """Delete a file or a folder tree, once approved."""
        path = self.workspace.resolve(args["path"])
        rel = self.workspace.relative(path)
        if rel == ".":
            raise ToolError("the workspace itself cannot be deleted")
        if not path.exists() and not path.is_symlink():
            raise ToolError(f"no file {args['path']!r}")
        if path.is_dir() and not path.is_symlink():
            count = sum(len(files) for _, _, files in os.walk(path))
            prompt = f"delete_file: delete the folder {rel}/ and everything in it ({count} files)"
        else:
            prompt = f"delete_file: delete the file {rel} ({_size(path.lstat().st_size)})"
        if not context.confirm(prompt):
            return ToolOutcome(DECLINED, ok=False, summary=DECLINED)
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
        return ToolOutcome(f"deleted {rel}", summary=f"deleted {rel}")

    # -- code -------------------------------------------------------------------------

    def _kernel(
        self, payload: dict[str, Any], timeout: float, context: ToolContext
    ) -> dict[str, Any]:
        self.packages_dir.mkdir(parents=True, exist_ok=True)
        try:
            return self.kernel.request(payload, timeout=timeout, control=context.control)
        except KernelTimeout as exc:
            raise ToolError(
                f"the code ran longer than {timeout:g} s and was stopped; the "
                "Python session was restarted, so earlier variables are gone"
            ) from exc
        except KernelDied as exc:
            raise ToolError(
                "the Python process died; it restarts on the next call, and "
                "earlier variables are gone"
            ) from exc

    def tool_run_python(self, args: dict[str, Any], context: ToolContext) -> ToolOutcome:
        """Code in the persistent kernel: output, traceback, figures and changed files."""
        code = args["code"]
        if not isinstance(code, str):
            raise ToolError("code must be a string")
        answer = self._kernel({"op": "exec", "code": code}, self._timeout(args), context)
        parts = []
        if answer.get("stdout") or answer.get("value"):
            # A DataFrame result's text ("value") follows what was printed, as a REPL shows it.
            printed = answer.get("stdout") or ""
            if answer.get("value"):
                separator = "\n" if printed and not printed.endswith("\n") else ""
                printed += separator + answer["value"]
            parts.append(printed.rstrip("\n"))
        if answer.get("stderr"):
            parts.append("stderr:\n" + answer["stderr"].rstrip("\n"))
        if answer.get("error"):
            parts.append(answer["error"].rstrip("\n"))
        if answer.get("figures"):
            parts.append("figures saved: " + ", ".join(answer["figures"]))
        changed = [f for f in answer.get("files") or [] if f not in (answer.get("figures") or [])]
        if changed:
            parts.append("files written: " + ", ".join(changed[:50]))
        text = "\n\n".join(parts) or "(no output)"
        written = (answer.get("figures") or []) + changed
        notify: dict[str, Any] = {
            "output": people_output(
                stdout=answer.get("stdout") or "",
                stderr=answer.get("stderr") or "",
                error=answer.get("error"),
            ),
            # What the call wrote (figures first): the page shows the images and the Plotly
            # figures among them at this call.
            "files": written[:50],
        }
        if isinstance(answer.get("table"), dict):
            notify["table"] = answer["table"]
        if answer.get("error"):
            return ToolOutcome(
                text, ok=False, summary=_summary_line(answer["error"]), notify=notify
            )
        summary = ("wrote " + ", ".join(written[:5])) if written else "ok"
        return ToolOutcome(text, summary=summary, notify=notify)

    def tool_shell(self, args: dict[str, Any], context: ToolContext) -> ToolOutcome:
        """A bash command in the workspace, once approved."""
        command = args["command"]
        if not isinstance(command, str) or not command.strip():
            raise ToolError("command must be a non-empty string")
        timeout = self._timeout(args)
        if not context.confirm(
            f"shell: run this command in the workspace (time limit {timeout:g} s):\n{command}"
        ):
            return ToolOutcome(DECLINED, ok=False, summary=DECLINED)
        shell = shutil.which("bash") or "/bin/sh"
        result = procs.run_command(
            [shell, "-c", command],
            cwd=self.workspace.root,
            env=procs.tool_environment(),
            timeout=timeout,
            control=context.control,
        )
        if result.timed_out:
            return ToolOutcome(
                f"the command ran longer than {timeout:g} s and was killed\n{result.output}",
                ok=False,
                summary="timed out",
            )
        text = f"exit code {result.exit_code}\n{result.output}".rstrip("\n")
        return ToolOutcome(
            text,
            ok=result.exit_code == 0,
            summary=f"exit code {result.exit_code}",
            notify={"output": people_output(stdout=result.output)},
        )

    def tool_install_package(self, args: dict[str, Any], context: ToolContext) -> ToolOutcome:
        """``pip install --target <private folder>``, once approved, one at a time."""
        spec = args["package"]
        if not isinstance(spec, str) or not spec.strip():
            raise ToolError("package must be a non-empty string")
        spec = spec.strip()
        if spec.endswith((".whl", ".tar.gz", ".zip")) and "://" not in spec:
            path = self.workspace.resolve(spec)
            if not path.is_file():
                raise ToolError(f"no package file {spec!r} in the workspace")
            target_spec = str(path)
        elif REQUIREMENT.match(spec):
            target_spec = spec
        else:
            raise ToolError(
                f"{spec!r} is not a package requirement (name, optional extras "
                "and version) nor a wheel file in the workspace"
            )
        shown = self._shown_packages_dir()
        if not context.confirm(f"install_package: pip install --target {shown} {spec}"):
            return ToolOutcome(DECLINED, ok=False, summary=DECLINED)
        self.packages_dir.mkdir(parents=True, exist_ok=True)
        lock_path = self.packages_dir / ".install.lock"
        with lock_path.open("w") as lock:
            # One install at a time, across the processes sharing this folder too.
            while True:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    context.control.sleep(0.2)
            timeout = max(300.0, self.tool_timeout)
            result = procs.run_command(
                [
                    sys.executable,
                    "-m",
                    "pip",
                    "install",
                    "--no-input",
                    "--disable-pip-version-check",
                    "--upgrade",
                    "--target",
                    str(self.packages_dir),
                    target_spec,
                ],
                cwd=self.workspace.root,
                env=procs.tool_environment(),
                timeout=timeout,
                control=context.control,
            )
        if result.timed_out or result.exit_code != 0:
            return ToolOutcome(f"pip failed:\n{result.output}", ok=False, summary="install failed")
        installed = [
            line for line in result.output.splitlines() if line.startswith("Successfully installed")
        ]
        return ToolOutcome(
            (installed[-1] if installed else result.output[-2000:])
            + "\nrun_python can import it now.",
            summary=f"installed {spec}",
        )

    def _shown_packages_dir(self) -> str:
        try:
            return self.packages_dir.relative_to(self.workspace.root).as_posix()
        except ValueError:
            return str(self.packages_dir)

    # -- data -------------------------------------------------------------------------

    def tool_run_sql(self, args: dict[str, Any], context: ToolContext) -> ToolOutcome:
        """One statement on a datasource, checked first (:meth:`_check_sql`); writes
        only once approved."""
        slug, query = args["datasource"], args["query"]
        if not isinstance(query, str) or not query.strip():
            raise ToolError("query must be a non-empty string")
        source = self.datasources.get(slug)
        if source is None:
            raise ToolError(
                f"no datasource {slug!r}; the datasources are: {', '.join(self.datasources)}"
            )
        from paw_sqlcheck import judge  # the parser loads on the first statement

        verdict = judge(query, dialect=source.dialect)
        began = time.monotonic()
        try:
            check = self._check_sql(source, query, verdict, context)
        except SqlError as exc:  # no connection, a session PAW cannot judge for
            return ToolOutcome(
                f"error: {exc}",
                ok=False,
                summary=_summary_line(str(exc)),
                notify={"sql_run": _sql_run(began, error=exc.code)},
            )
        if check is not None and check.refused:
            return self._sent_back(source, query, verdict, check, context)
        notify: dict[str, Any] = {}
        if check is not None:
            notify["sql_check"] = self._check_data(check, context)
        explained = check is not None and check.explained
        if not verdict.read and source.read_only:
            raise ToolError(
                f"datasource {source.slug} is read-only and this statement is not a read: "
                f"{verdict.reason}. Only one SELECT, WITH or EXPLAIN that changes nothing "
                "and calls only the usual functions runs on it"
            )
        if not verdict.read and not context.confirm(
            f"run_sql on {source.name} ({source.slug}, {source.dialect}) — this statement is "
            f"not a read, so it may change data: {verdict.reason}.\n{query.strip()}"
        ):
            return ToolOutcome(DECLINED, ok=False, summary=DECLINED)
        began = time.monotonic()
        try:
            result = run_query(
                source,
                query,
                read_only=verdict.read,
                timeout=self.tool_timeout,
                control=context.control,
                keep=self.sql_result_rows,
                explain=verdict.explain,
            )
        except SqlError as exc:
            notify["sql_run"] = _sql_run(began, error=exc.code, explained=explained)
            return ToolOutcome(
                f"error: {exc}", ok=False, summary=_summary_line(str(exc)), notify=notify
            )
        text = result.text()
        structured = result.structured(datasource=slug, sql=query, rows=self.sql_result_rows)
        notify["sql_run"] = _sql_run(began, row_count=result.row_count, explained=explained)
        if structured is not None:
            notify["sql_result"] = structured
        return ToolOutcome(text, summary=_summary_line(text), notify=notify)

    def _check_sql(
        self, source: Datasource, query: str, verdict: Any, context: ToolContext
    ) -> Check | None:
        """The check before ``query`` runs (:mod:`paw_agent.precheck`): a statement the
        parser refused is sent back; a read (not itself an ``EXPLAIN``) is ``EXPLAIN``ed
        within ``sql_check_timeout`` seconds. None when there is nothing to check (not a
        read, an ``EXPLAIN``, no check this run). Once the run's checks have sent
        ``--sql-retries`` statements back, the rest run unchecked (a ``skipped`` check).
        Raises :class:`~paw_agent.sql.SqlError` (no connection…) and ``Stopped``."""
        checks = context.sql_checks
        checkable = verdict.code == "unparsed" or (verdict.read and not verdict.explain)
        if checks is None or checks.retries <= 0 or not checkable:
            return None
        if checks.left <= 0:
            return Check(
                outcome="skipped",
                code="retries_used",
                message=f"not checked: {checks.refused} statements were sent back already",
            )
        if verdict.code == "unparsed":
            return parse_refusal(query, verdict.reason)
        timeout = min(self.sql_check_timeout, self.tool_timeout)
        return explain_check(source, query, timeout=timeout, control=context.control)

    def _check_data(self, check: Check, context: ToolContext) -> dict[str, Any]:
        """``sql_check`` of a ``notify tool``: :meth:`Check.data` and the run's
        ``retries`` and how many are ``left``."""
        checks = context.sql_checks
        retries = checks.retries if checks is not None else 0
        left = checks.left if checks is not None else 0
        return {**check.data(), "retries": retries, "left": left}

    def _sent_back(
        self, source: Datasource, query: str, verdict: Any, check: Check, context: ToolContext
    ) -> ToolOutcome:
        """The answer to a statement the check refused: not run, the database's (or the
        parser's) message and the ``schema`` entries of the tables it names, from the
        run's knowledge (and those named most like a table it does not know)."""
        checks = context.sql_checks
        if checks is not None:
            checks.refused += 1
        parts = [f"error: not run; the check before running refused it: {check.detail}"]
        if context.knowledge is not None:
            parts += self._tables_named(source, query, verdict, check, context.knowledge)
        left = checks.left if checks is not None else 0
        parts.append(
            "Correct the statement and call run_sql again"
            + (
                f" ({left} more may be sent back in this run; then statements run unchecked)."
                if left
                else " (the next statements of this run run unchecked)."
            )
        )
        notify: dict[str, Any] = {"sql_check": self._check_data(check, context)}
        if check.explained:
            notify["sql_run"] = {
                "duration_ms": check.duration_ms,
                "row_count": None,
                "error": "check_failed",
                "explained": True,
            }
        return ToolOutcome(
            "\n\n".join(parts), ok=False, summary=f"checked: {check.message}", notify=notify
        )

    @staticmethod
    def _tables_named(
        source: Datasource, query: str, verdict: Any, check: Check, knowledge: Knowledge
    ) -> list[str]:
        """What the run's knowledge says of the tables a statement sent back names: their
        ``schema`` entries; for a name it has no entry for, the entries named most like
        it (or that it knows none). A statement that does not parse has no tree: the
        entries of the known tables among its words."""
        if verdict.code == "unparsed":
            words = re.findall(r"[A-Za-z_][\w$]*(?:\.[A-Za-z_][\w$]*)*", query)
            names = list(dict.fromkeys(words))
        else:
            names = list(verdict.tables)
            if check.code == "unknown_table" and check.name and check.name not in names:
                names.append(check.name)
        named, missing = knowledge.schema_entries(source.slug, names, similar=False)
        parts = []
        if named:
            parts.append(
                "The tables it names, as PAW knows them:\n\n"
                + "\n\n".join(format_entry(entry) for entry in named)
            )
        if verdict.code == "unparsed" or not missing:
            return parts
        alike, _ = knowledge.schema_entries(source.slug, missing, limit=3)
        unknown = ", ".join(missing)
        if alike:
            parts.append(
                f"PAW knows no table named {unknown}; the tables named most like it:\n\n"
                + "\n\n".join(format_entry(entry) for entry in alike)
            )
        else:
            parts.append(
                f"PAW knows no table named {unknown} in {source.slug}; search_knowledge may "
                "find what you need."
            )
        return parts

    def tool_search_knowledge(self, args: dict[str, Any], context: ToolContext) -> ToolOutcome:
        """The entries of the run's knowledge indexes most relevant to ``query``."""
        query = args["query"]
        if not isinstance(query, str) or not query.strip():
            raise ToolError("query must be a non-empty string")
        knowledge = context.knowledge
        if knowledge is None or not knowledge.indexes:
            raise ToolError("PAW gave this run no knowledge to search")
        datasource = args.get("datasource") or None
        if datasource is not None and datasource not in knowledge.datasources:
            raise ToolError(
                f"no knowledge of datasource {datasource!r}; there is: "
                + ", ".join(knowledge.datasources)
            )
        kind = args.get("kind") or None
        if kind is not None and kind not in KINDS:
            raise ToolError(f"kind is one of {', '.join(KINDS)}")
        limit = args.get("limit") if isinstance(args.get("limit"), int) else 5
        try:
            found = knowledge.search(
                query, datasource=datasource, kind=kind, limit=max(1, min(limit, MAX_LIMIT))
            )
        except sqlite3.Error as exc:
            raise ToolError(f"the knowledge index cannot be read: {exc}") from exc
        if not found:
            return ToolOutcome("nothing found; try other words", summary="nothing found")
        text = "\n\n".join(format_entry(entry) for entry in found)
        # The ids the host's lineage names (it takes kind and title from its own rows).
        entries = [
            {"id": e["id"], "datasource": e["datasource"], "kind": e["kind"], "title": e["title"]}
            for e in found
        ]
        return ToolOutcome(
            text,
            summary=f"{len(found)} entries: " + ", ".join(e["title"] for e in found)[:100],
            notify={"entries": entries},
        )

    # -- people -----------------------------------------------------------------------

    def tool_update_plan(self, args: dict[str, Any], context: ToolContext) -> ToolOutcome:
        """The agent's plan (todos) for the user: a ``notify todos`` whose data is
        ``[{"content": str, "status": "pending" | "in_progress" | "completed"}]``, the shape
        python-agent-harness uses for its todo list."""
        steps = args["steps"]
        if not isinstance(steps, list) or not steps:
            raise ToolError("steps must be a non-empty list")
        if len(steps) > MAX_PLAN_STEPS:
            raise ToolError(f"a plan has at most {MAX_PLAN_STEPS} steps")
        plan = []
        for step in steps:
            if not isinstance(step, dict) or not str(step.get("content") or "").strip():
                raise ToolError("each step needs a content")
            status = step.get("status", "pending")
            if status not in PLAN_STATUSES:
                raise ToolError(f"a step's status is one of {', '.join(PLAN_STATUSES)}")
            plan.append({"content": str(step["content"]).strip()[:500], "status": status})
        context.notify("todos", plan)
        done = sum(step["status"] == "completed" for step in plan)
        return ToolOutcome(
            f"plan shown to the user ({done} of {len(plan)} steps done)",
            summary=f"{done} of {len(plan)} steps done",
        )

    def tool_ask_user(self, args: dict[str, Any], context: ToolContext) -> ToolOutcome:
        """A question (with optional options) to the user: a ``notify ask``."""
        question = args["question"]
        if not isinstance(question, str) or not question.strip():
            raise ToolError("question must be a non-empty string")
        options = [str(o) for o in args.get("options") or [] if str(o).strip()]
        answer = context.ask([{"question": question, "options": options}])
        if answer is None:
            return ToolOutcome("the user did not answer in time", ok=False, summary="no answer")
        return ToolOutcome(f"the user answered: {answer}", summary=f"answered: {answer[:80]}")
