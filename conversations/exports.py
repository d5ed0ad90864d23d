"""A conversation exported as a file: Markdown (a zip with the files it shows), JSON (its
stored events) or a Jupyter notebook (its ``run_python`` calls as code cells).

Bounded memory: events are read from the database in chunks (at most
:data:`EXPORT_MAX_EVENTS` of them; past that the export stops and says so) and the export
is written into a temporary file that spills to disk past :data:`SPOOL_BYTES`; files of the
workspace are copied in chunks (zip) or embedded one at a time (notebook), each at most
:data:`EXPORT_MAX_FILE_BYTES` and :data:`EXPORT_MAX_FILES_BYTES` in all. The caller streams
the file (:func:`conversations.api.downloads.download_response`).

Files are exported as they are in the workspace at export time: a file the agent rewrote
later, or deleted, is the newer version, or is left out with a note.
"""

from __future__ import annotations

import base64
import json
import re
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any
from urllib.parse import quote
from uuid import UUID

from django.core.serializers.json import DjangoJSONEncoder
from django.utils import timezone

from accounts.models import User
from conversations.models import Conversation, ConversationFile, Run, RunEvent
from conversations.selectors.artifacts import OpenArtifact
from conversations.selectors.conversations import conversation_get
from conversations.selectors.lineage import lineage_summary, run_lineage_of
from conversations.selectors.workspaces import workspace_open

EXPORT_FORMATS = ("md", "json", "ipynb")
#: How the JSON export writes one stored event (the events API's form).
EventForm = Callable[[RunEvent], dict[str, Any]]
#: Events read for one export (streamed text counts: one delta is one event).
EXPORT_MAX_EVENTS = 100_000
#: Bytes of one workspace file put into an export; a larger one is named, not included.
EXPORT_MAX_FILE_BYTES = 10 * 1024 * 1024
#: Bytes of workspace files put into one export in all.
EXPORT_MAX_FILES_BYTES = 50 * 1024 * 1024
#: Bytes of an export held in memory before it spills to a temporary file on disk.
SPOOL_BYTES = 1024 * 1024
#: Bytes copied at a time.
COPY_BYTES = 256 * 1024
#: Events read from the database at a time.
CHUNK_EVENTS = 500

#: Images shown inline (Markdown ``![]()``, a notebook's ``display_data``), by suffix.
IMAGE_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
}
#: The folder of a Markdown zip holding the workspace files the transcript shows.
FILES_DIR = "files"


# --- the transcript, read from the events -------------------------------------------------


@dataclass
class ToolStep:
    """One tool call of a turn: ``name``, ``code`` (a ``run_python``'s whole code, or
    ``None`` when the runtime sent only short reprs), ``args`` (the arguments shown:
    paw-agent's whole values, else the protocol's short reprs), and once it finished
    ``ok``, ``summary``, ``output`` (``{"stdout", "stderr", "error"}``) and ``files``
    (workspace paths it wrote)."""

    name: str
    args: dict[str, Any]
    code: str | None = None
    done: bool = False
    ok: bool = True
    summary: str = ""
    output: dict[str, Any] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)


@dataclass
class TextStep:
    """Text the agent wrote between tool calls."""

    text: str


@dataclass
class Turn:
    """One run: its ``prompt``, its ``steps`` in order, its ``answer`` and ``errors``
    (plain messages)."""

    run_id: UUID
    prompt: str = ""
    steps: list[ToolStep | TextStep] = field(default_factory=list)
    answer: str = ""
    errors: list[str] = field(default_factory=list)
    cancelled: bool = False
    created: datetime | None = None
    #: The title of the verified example whose SQL the run's result ran (PAW's
    #: ``Run.result["verified"]``), else "".
    verified: str = ""
    lineage: dict[str, Any] | None = None


class _TurnReader:
    """Folds a run's events into a :class:`Turn` (one run at a time, events in order)."""

    def __init__(self, run_id: UUID, run: Run | None) -> None:
        self.turn = Turn(run_id=run_id, prompt=run.prompt if run else "")
        self.turn.created = run.created_at if run else None
        verified = (
            (run.result or {}).get("verified") if run and isinstance(run.result, dict) else None
        )
        if isinstance(verified, dict):
            self.turn.verified = str(verified.get("title") or "")
        self.turn.lineage = run_lineage_of(run)
        self.run = run
        self.pending = ""  # streamed text not yet followed by a tool call or the result
        self.result_seen = False

    def feed(self, payload: dict[str, Any]) -> None:
        kind, data = payload.get("kind"), payload.get("data")
        line = payload.get("type")
        if line == "start" and isinstance(payload.get("prompt"), str):
            self.turn.prompt = payload["prompt"]
        elif line == "delta" and isinstance(payload.get("text"), str):
            self.pending += payload["text"]
        elif line == "notify" and kind == "tool_calls" and isinstance(data, list):
            self._flush_text()
            for call in data:
                if isinstance(call, dict) and isinstance(call.get("name"), str):
                    self.turn.steps.append(_tool_step(call))
        elif line == "notify" and kind == "tool" and isinstance(data, dict):
            self._tool_done(data)
        elif line == "result":
            self.result_seen = True
            self.pending = ""  # the streamed answer: the result carries it whole
            if isinstance(payload.get("answer"), str):
                self.turn.answer = payload["answer"]
            messages = payload.get("error_messages")
            if isinstance(messages, list):
                self.turn.errors = [str(m) for m in messages]
            self.turn.cancelled = bool(payload.get("cancelled"))

    def _flush_text(self) -> None:
        if self.pending.strip():
            self.turn.steps.append(TextStep(self.pending.strip()))
        self.pending = ""

    def _tool_done(self, data: dict[str, Any]) -> None:
        step = next(
            (
                s
                for s in self.turn.steps
                if isinstance(s, ToolStep) and not s.done and s.name == data.get("name")
            ),
            None,
        )
        if step is None:  # a runtime without tool_calls: the result alone
            step = ToolStep(name=str(data.get("name") or "tool"), args={})
            self.turn.steps.append(step)
        step.done = True
        step.ok = bool(data.get("ok", True))
        step.summary = str(data.get("summary") or "")
        output = data.get("output")
        step.output = output if isinstance(output, dict) else {}
        files = data.get("files")
        step.files = [f for f in files if isinstance(f, str)] if isinstance(files, list) else []

    def finish(self) -> Turn:
        if not self.result_seen:  # no result line (a lost worker): what the run row says
            self.turn.answer = self.pending.strip() or (self.run.answer if self.run else "")
            if self.run and self.run.errors:
                self.turn.errors = [
                    str(e.get("message") if isinstance(e, dict) else e) for e in self.run.errors
                ]
        return self.turn


def _tool_step(call: dict[str, Any]) -> ToolStep:
    """A :class:`ToolStep` from one ``tool_calls`` item (paw-agent's ``input``: the whole
    values; else the protocol's ``args``: short reprs)."""
    full = call.get("input") if isinstance(call.get("input"), dict) else None
    args = (
        full
        if full is not None
        else (call.get("args") if isinstance(call.get("args"), dict) else {})
    )
    code = full.get("code") if full and isinstance(full.get("code"), str) else None
    return ToolStep(name=call["name"], args=args, code=code)


@dataclass
class Transcript:
    """A conversation's turns and whether the events were cut at :data:`EXPORT_MAX_EVENTS`."""

    turns: list[Turn]
    truncated: bool


def _events(conversation: Conversation) -> Iterator[RunEvent]:
    return (
        RunEvent.objects.filter(conversation=conversation)
        .order_by("cursor")[: EXPORT_MAX_EVENTS + 1]
        .iterator(chunk_size=CHUNK_EVENTS)
    )


def _turns(conversation: Conversation) -> Iterator[Turn | None]:
    """The conversation's turns in order, read from its events; ``None`` last when the
    events were cut at :data:`EXPORT_MAX_EVENTS`. Runs are one at a time per conversation,
    so a run's events are contiguous."""
    runs = {run.id: run for run in Run.objects.filter(conversation=conversation).defer("usage")}
    reader: _TurnReader | None = None
    for count, event in enumerate(_events(conversation), start=1):
        if count > EXPORT_MAX_EVENTS:
            if reader is not None:
                yield reader.finish()
            yield None
            return
        if event.run_id is None or not isinstance(event.payload, dict):
            continue  # PAW's notices: not part of a turn
        if reader is None or reader.turn.run_id != event.run_id:
            if reader is not None:
                yield reader.finish()
            reader = _TurnReader(event.run_id, runs.get(event.run_id))
        reader.feed(event.payload)
    if reader is not None:
        yield reader.finish()


def _uploads(conversation: Conversation) -> list[ConversationFile]:
    return list(ConversationFile.objects.filter(conversation=conversation).order_by("name"))


def _suffix(path: str) -> str:
    name = path.rsplit("/", 1)[-1]
    return ("." + name.rsplit(".", 1)[-1].lower()) if "." in name else ""


class _FileBudget:
    """Reads workspace files for one export within :data:`EXPORT_MAX_FILE_BYTES` each and
    :data:`EXPORT_MAX_FILES_BYTES` in all."""

    def __init__(self, conversation_id: UUID) -> None:
        self.conversation_id = conversation_id
        self.used = 0

    def open(self, path: str) -> tuple[IO[bytes], int] | None:
        """The file at ``path`` opened (the caller closes it), or ``None`` when it is gone,
        refused by the workspace's rules, or over the budget."""
        opened = workspace_open(self.conversation_id, path)
        if opened is None:
            return None
        file, size = opened
        if size > EXPORT_MAX_FILE_BYTES or self.used + size > EXPORT_MAX_FILES_BYTES:
            file.close()
            return None
        self.used += size
        return file, size


def _safe_name(title: str, extension: str) -> str:
    """A download name from the title: letters, digits, spaces, ``-`` and ``_`` kept (any
    script), the rest ``_``, at most 80 characters; ``conversation`` when nothing is left."""
    stem = re.sub(r"[^\w\- ]+", "_", title, flags=re.UNICODE).strip(" _")[:80].strip()
    return f"{stem or 'conversation'}.{extension}"


# --- writers --------------------------------------------------------------------------------


def _fence(text: str, info: str = "") -> str:
    """``text`` in a Markdown code fence longer than any backtick run inside it."""
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return f"{ticks}{info}\n{text.rstrip(chr(10))}\n{ticks}"


def _arg_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)


def _quote_block(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.splitlines() or [""])


def _header_lines(conversation: Conversation, uploads: list[ConversationFile]) -> list[str]:
    lines = [
        f"# {conversation.title or 'Conversation'}",
        "",
        f"Exported from PAW on {timezone.now():%Y-%m-%d %H:%M} UTC "
        f"(conversation `{conversation.id}`).",
    ]
    if uploads:
        lines += ["", "Uploaded files: " + ", ".join(f"`{f.name}`" for f in uploads) + "."]
    return lines


def _write_markdown(conversation: Conversation, out: IO[bytes], _: EventForm) -> tuple[str, str]:
    """conversation.md, zipped with the workspace files it links to when there are any.
    The text is written block by block into a temporary file of its own (the zip takes
    the files as they come), then copied. Returns ``(extension, content type)``."""
    budget = _FileBudget(conversation.id)
    included: dict[str, str] = {}  # workspace path -> its name in the zip
    archive: zipfile.ZipFile | None = None
    text = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115 (closed below)

    def emit(block: str) -> None:
        text.write((("\n\n" if text.tell() else "") + block).encode())

    def link(path: str) -> str | None:
        nonlocal archive
        if path not in included:
            opened = budget.open(path)
            if opened is None:
                return None
            file, _ = opened
            if archive is None:
                archive = zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED)
            with file, archive.open(f"{FILES_DIR}/{path}", "w") as entry:
                while chunk := file.read(COPY_BYTES):
                    entry.write(chunk)
            included[path] = f"{FILES_DIR}/{path}"
        return quote(included[path])

    with text:
        emit("\n".join(_header_lines(conversation, _uploads(conversation))))
        for turn in _turns(conversation):
            if turn is None:
                emit(f"*The export stops here: it holds the first {EXPORT_MAX_EVENTS} events.*")
                break
            emit("## You\n\n" + _quote_block(turn.prompt))
            for step in turn.steps:
                if isinstance(step, TextStep):
                    emit(step.text)
                    continue
                lines = [f"**Tool `{step.name}`**" + (f": {step.summary}" if step.summary else "")]
                if step.code is not None:
                    lines.append(_fence(step.code, "python"))
                else:
                    lines += [
                        f"- `{key}`:\n\n{_fence(_arg_text(v))}" for key, v in step.args.items()
                    ]
                for stream in ("stdout", "stderr", "error"):
                    if step.output.get(stream):
                        lines.append(f"{stream}:\n\n{_fence(str(step.output[stream]))}")
                for path in step.files:
                    target = link(path)
                    if target is None:
                        lines.append(f"*`{path}` is not in this export (gone, or too large).*")
                    elif _suffix(path) in IMAGE_TYPES or _suffix(path) == ".webp":
                        lines.append(f"![{path}]({target})")
                    else:
                        lines.append(f"File: [{path}]({target})")
                emit("\n\n".join(lines))
            if turn.answer:
                emit("**Answer**\n\n" + turn.answer)
            if turn.verified:
                emit(f"*✓ Verified query: {turn.verified}*")
            if based_on := lineage_summary(turn.lineage):
                emit(based_on)
            if turn.cancelled:
                emit("*Cancelled.*")
            for error in turn.errors:
                emit(f"*Error: {error}*")
        text.write(b"\n")
        text.seek(0)
        if archive is None:
            while chunk := text.read(COPY_BYTES):
                out.write(chunk)
            return "md", "text/markdown; charset=utf-8"
        with archive, archive.open("conversation.md", "w") as entry:
            while chunk := text.read(COPY_BYTES):
                entry.write(chunk)
        return "zip", "application/zip"


def _write_json(
    conversation: Conversation, out: IO[bytes], event_form: EventForm
) -> tuple[str, str]:
    """``{"format", "conversation": {...}, "events": [...], "truncated": bool}``, each
    event as ``event_form`` gives it, written one at a time."""
    meta = {
        "id": str(conversation.id),
        "title": conversation.title,
        "created": conversation.created_at,
        "last_activity": conversation.last_activity_at,
        "llm_provider": conversation.llm_provider,
        "llm_model": conversation.llm_model,
        "datasources": conversation.datasources,
        "files": [
            {"name": f.name, "size": f.size, "sha256": f.sha256} for f in _uploads(conversation)
        ],
        "exported": timezone.now(),
    }

    def dump(value: Any) -> bytes:
        return json.dumps(value, cls=DjangoJSONEncoder, ensure_ascii=False).encode()

    out.write(b'{"format": "paw-conversation-events/1", "conversation": ' + dump(meta))
    out.write(b', "events": [')
    truncated = False
    for count, event in enumerate(_events(conversation), start=1):
        if count > EXPORT_MAX_EVENTS:
            truncated = True
            break
        out.write((b",\n" if count > 1 else b"\n") + dump(event_form(event)))
    out.write(b'\n], "truncated": ' + dump(truncated))
    # What each answer rests on (the runs on datasources): lineage is not an event.
    lineage = [
        {"run_id": str(run_id), "lineage": result["lineage"]}
        for run_id, result in Run.objects.filter(conversation=conversation, result__isnull=False)
        .order_by("created_at")
        .values_list("id", "result")
        if isinstance(result, dict) and isinstance(result.get("lineage"), dict)
    ]
    out.write(b', "lineage": ' + dump(lineage) + b"}\n")
    return "json", "application/json"


def _lines(text: str) -> list[str]:
    """A notebook's multi-line string: lines keeping their ``\\n``."""
    return text.splitlines(keepends=True)


def _markdown_cell(text: str) -> dict[str, Any]:
    return {"cell_type": "markdown", "metadata": {}, "source": _lines(text)}


def _notebook_intro(conversation: Conversation, uploads: list[ConversationFile]) -> str:
    lines = _header_lines(conversation, [])
    lines += [
        "",
        "**How this notebook re-runs.** Each code cell is a `run_python` call the agent made, "
        "in order, with the output it had then. The agent's Python ran in one kernel whose "
        "working directory was the conversation's workspace, so:",
        "",
    ]
    if uploads:
        lines.append(
            "- put these files (the conversation's uploads) in the notebook's working "
            "directory before running it:"
        )
        lines += [f"  - `{f.name}` ({f.size} bytes)" for f in uploads]
    else:
        lines.append("- the conversation had no uploaded files;")
    lines += [
        "- run the cells top to bottom: later cells use the variables of earlier ones;",
        "- the cells write their files (charts, spreadsheets) into the working directory;",
        "- other tool calls (SQL queries, reading or listing files) are shown as notes: "
        "they do not re-run, and code that used their answers may need them pasted in;",
        "- the packages the agent's kernel had (pandas, matplotlib, …) must be installed.",
    ]
    return "\n".join(lines)


def _error_output(error: str) -> dict[str, Any]:
    """A notebook ``error`` output from a traceback's text (its last line ``Name: value``)."""
    last = next((line for line in reversed(error.splitlines()) if line.strip()), "Error")
    name, _, value = last.partition(":")
    return {
        "output_type": "error",
        "ename": name.strip() or "Error",
        "evalue": value.strip(),
        "traceback": error.splitlines(),
    }


def _code_cell(step: ToolStep, count: int, budget: _FileBudget) -> dict[str, Any]:
    outputs: list[dict[str, Any]] = []
    for stream in ("stdout", "stderr"):
        if step.output.get(stream):
            outputs.append(
                {"output_type": "stream", "name": stream, "text": _lines(str(step.output[stream]))}
            )
    if step.output.get("error"):
        outputs.append(_error_output(str(step.output["error"])))
    for path in step.files:
        mime = IMAGE_TYPES.get(_suffix(path))
        if mime is None:
            continue
        opened = budget.open(path)
        if opened is None:
            continue
        file, _ = opened
        with file:
            data = base64.b64encode(file.read()).decode("ascii")
        outputs.append(
            {
                "output_type": "display_data",
                "data": {mime: data, "text/plain": [path]},
                "metadata": {"paw": {"path": path}},
            }
        )
    return {
        "cell_type": "code",
        "execution_count": count,
        "metadata": {"paw": {"tool": step.name, "ok": step.ok}},
        "source": _lines(step.code or ""),
        "outputs": outputs,
    }


def _tool_note(step: ToolStep) -> str:
    lines = [f"**Tool `{step.name}`**" + (f": {step.summary}" if step.summary else "")]
    lines += [f"- `{key}`:\n\n{_fence(_arg_text(v))}" for key, v in step.args.items()]
    for stream in ("stdout", "stderr", "error"):
        if step.output.get(stream):
            lines.append(f"{stream}:\n\n{_fence(str(step.output[stream]))}")
    return "\n\n".join(lines)


def _write_notebook(conversation: Conversation, out: IO[bytes], _: EventForm) -> tuple[str, str]:
    """An nbformat 4.5 notebook, written one cell at a time."""
    budget = _FileBudget(conversation.id)
    cell_ids = iter(range(1, EXPORT_MAX_EVENTS * 4))
    first = True

    def write(cell: dict[str, Any]) -> None:
        nonlocal first
        cell = {"id": f"cell-{next(cell_ids)}", **cell}
        out.write((b"" if first else b",\n") + json.dumps(cell, ensure_ascii=False).encode())
        first = False

    out.write(b'{"nbformat": 4, "nbformat_minor": 5, "metadata": ')
    metadata = {
        "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
        "language_info": {"name": "python"},
        "paw": {"conversation": str(conversation.id), "title": conversation.title},
    }
    out.write(json.dumps(metadata, ensure_ascii=False).encode() + b', "cells": [\n')
    write(_markdown_cell(_notebook_intro(conversation, _uploads(conversation))))
    count = 0
    for turn in _turns(conversation):
        if turn is None:
            write(
                _markdown_cell(
                    f"*The export stops here: it holds the first {EXPORT_MAX_EVENTS} events.*"
                )
            )
            break
        write(_markdown_cell("### You\n\n" + _quote_block(turn.prompt)))
        for step in turn.steps:
            if isinstance(step, TextStep):
                write(_markdown_cell(step.text))
            elif step.name == "run_python" and step.code is not None:
                count += 1
                write(_code_cell(step, count, budget))
            else:
                write(_markdown_cell(_tool_note(step)))
        closing = [turn.answer] if turn.answer else []
        closing += [based_on] if (based_on := lineage_summary(turn.lineage)) else []
        closing += ["*Cancelled.*"] if turn.cancelled else []
        closing += [f"*Error: {error}*" for error in turn.errors]
        if closing:
            cell = _markdown_cell("\n\n".join(closing))
            if turn.lineage is not None:  # what the answer rests on, for tools reading it
                cell["metadata"] = {"paw": {"run": str(turn.run_id), "lineage": turn.lineage}}
            write(cell)
    out.write(b"\n]}\n")
    return "ipynb", "application/x-ipynb+json"


_WRITERS = {"md": _write_markdown, "json": _write_json, "ipynb": _write_notebook}


def conversation_export(
    *, user: User, conversation_id: UUID | str, export_format: str, event_form: EventForm
) -> OpenArtifact:
    """The user's conversation exported as ``export_format`` (one of
    :data:`EXPORT_FORMATS`): an :class:`OpenArtifact` whose ``file`` (a temporary file,
    at its start; the caller closes it) holds the export, named after the title.

    - ``md``: ``conversation.md``; zipped (``.zip``) with the workspace files it shows
      under ``files/`` (relative links) when it shows any, else plain ``.md``.
    - ``json``: ``{"format", "conversation", "events", "truncated"}``, each event as
      ``event_form`` gives it (the API passes its events form, so both say the same).
    - ``ipynb``: nbformat 4.5; prompts and answers as Markdown cells, each ``run_python``
      call as a code cell with its output (stream text, the images it wrote as
      ``display_data``).

    Raises ``NotFound`` (404) for a conversation that is not the user's, ``ValueError``
    for an unknown format (the API validates it first)."""
    writer = _WRITERS.get(export_format)
    if writer is None:
        raise ValueError(f"unknown export format {export_format!r}")
    conversation = conversation_get(user=user, conversation_id=conversation_id)
    out = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115 (the caller closes it)
    try:
        extension, content_type = writer(conversation, out, event_form)
        size = out.tell()
        out.seek(0)
    except BaseException:
        out.close()
        raise
    return OpenArtifact(
        file=out,  # type: ignore[arg-type]
        name=_safe_name(conversation.title, extension),
        size=size,
        content_type=content_type,
    )
