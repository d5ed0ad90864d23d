"""The agent: what lives as long as the process (memory, kernel, model client) and the
loop of one run (model rounds, tools, approvals, bounds, context budget).

Bounds (issue 3): at most ``max_rounds`` tool rounds per run (code ``budget``), a wall
clock per run (code ``timeout``), ``max_output_tokens`` per model call, a context budget
in tokens (older turns are summarized by a model call, then dropped; old tool output of
the current run is elided; a request that still does not fit fails with code ``context``
instead of overflowing the provider), and the memory of the last ``memory_turns`` turns.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import threading
import time
import traceback
import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paw_agent import procs
from paw_agent.control import RunControl, Stopped
from paw_agent.images import DEFAULT_MAX_BYTES, ImageRefused, estimate_text, image_part
from paw_agent.kernel_client import PythonKernel
from paw_agent.knowledge import Knowledge
from paw_agent.model import Completion, ModelClient, ModelError, estimate_tokens
from paw_agent.protocol import DeltaBuffer, RunStream
from paw_agent.sql import load_datasources
from paw_agent.tools import GATED, SqlChecks, Toolbox, ToolContext, display_args, full_args
from paw_agent.workspace import PRIVATE_DIR, Workspace

APPROVE = {"y", "yes", "true", "1"}  # PROTOCOL.md: a confirm's first answer approves
SUMMARY_LIMIT = 4000  # characters of the running summary of dropped turns
ELIDED = "[output elided to fit the context budget]"


@dataclass
class Settings:
    """The process's configuration (the ``serve`` flags). Times in seconds, 0 = no limit;
    token counts in tokens."""

    project: Path
    answer_timeout: float = 0.0
    max_rounds: int = 10
    timeout: float = 0.0
    max_output_tokens: int = 4096
    context_budget: int = 100_000
    memory_turns: int = 12
    stream: bool = True
    tool_timeout: float = 120.0
    packages_dir: Path | None = None
    attempts: int = 4
    retry_base: float = 0.5
    sql_result_rows: int = 100
    #: Statements the check before ``run_sql`` may send back per run (0: no check), and
    #: the seconds its ``EXPLAIN`` may take (``paw_agent.precheck``).
    sql_retries: int = 2
    sql_check_timeout: float = 5.0
    max_image_bytes: int = DEFAULT_MAX_BYTES
    warm: bool = True  # import the model SDK right after ``ready``, not on the first call
    #: Streamed pieces closer together than this many seconds share a ``delta`` line
    #: (``protocol.DeltaBuffer``); 0: a line per piece.
    delta_window: float = 0.003


@dataclass
class Turn:
    """One earlier exchange of the conversation."""

    prompt: str
    answer: str


class RunFailed(Exception):
    """A run that ends with an error ``code`` (``budget``, ``no_answer``, ``context``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Agent:
    """Process-wide state: workspace, model client, Python kernel, tools, datasources and
    the conversation memory (last ``memory_turns`` turns plus a summary of older ones).
    ``environ`` supplies ``OPENAI_*`` and ``PAW_DATASOURCE*``. ``model``: a model client
    to keep (a spare's, its SDK imported and its transport built), pointed at
    ``environ``'s endpoint. Raises ``FileNotFoundError`` if the project folder does not
    exist."""

    def __init__(
        self, settings: Settings, environ: Mapping[str, str], *, model: ModelClient | None = None
    ) -> None:
        self.settings = settings
        self.workspace = Workspace(settings.project)
        endpoint = {
            "model": environ.get("OPENAI_MODEL") or "gpt-4o-mini",
            "base_url": environ.get("OPENAI_BASE_URL") or None,
            "api_key": environ.get("OPENAI_API_KEY") or None,
        }
        if model is not None:
            model.configure(**endpoint)
            self.model = model
        else:
            self.model = ModelClient(
                **endpoint,
                stream=settings.stream,
                max_output_tokens=settings.max_output_tokens,
                attempts=settings.attempts,
                retry_base=settings.retry_base,
            )
        self.memory: deque[Turn] = deque(maxlen=max(0, settings.memory_turns))
        self.summary = ""
        packages = settings.packages_dir or self.workspace.root / PRIVATE_DIR / "site-packages"
        self.kernel = PythonKernel(self.workspace.root, packages)
        datasources, self.warnings = load_datasources(environ)
        self.toolbox = Toolbox(
            workspace=self.workspace,
            kernel=self.kernel,
            datasources=datasources,
            packages_dir=packages,
            tool_timeout=settings.tool_timeout,
            sql_result_rows=settings.sql_result_rows,
            sql_check_timeout=settings.sql_check_timeout,
        )

    def seed_history(self, turns: list[Turn]) -> None:
        """Replace the memory with ``turns`` (the newest ``memory_turns`` of them)."""
        self.memory.clear()
        self.memory.extend(turns)
        self.summary = ""

    def close(self) -> None:
        """Kill the kernel, every tool process group and every other descendant (the
        process is ending)."""
        self.stop_tools()

    def stop_tools(self) -> None:
        """Kill every process the tools started: the Python kernel (its variables are
        gone; the next ``run_python`` starts a fresh one), every tool's process group, and
        every other descendant of this process — also one that started a session of its
        own and cleared its environment, which paw-agent, a child subreaper
        (``procs.become_subreaper``), adopted when its parent went. Done when a run is
        stopped (cancel, timeout), before its ``result`` is written."""
        self.kernel.stop()
        procs.kill_all()
        procs.kill_descendants()

    def system_prompt(self, allowed: frozenset[str] | None = None) -> str:
        """The system message: the job, the rules, and the datasources. A run restricted
        to the SQL tools (``allowed``) is told to answer with a query instead."""
        if allowed is not None and "run_sql" in allowed and "run_python" not in allowed:
            return self._sql_prompt(allowed)
        lines = [
            "You are PAW's data agent. You work on the files of this conversation's "
            "workspace: the files the user uploaded and the ones you produce.",
            f"Today is {time.strftime('%Y-%m-%d')}.",
            "",
            "How to work:",
            "- Paths are relative to the workspace; absolute paths, '..' and symlinks "
            "leading outside it are refused.",
            "- For data work use run_python (pandas, openpyxl and matplotlib are installed; "
            "variables persist between calls). Save what the user asks for as files in the "
            "workspace (.xlsx, .csv, .png, ...) and name them in your answer.",
            "- shell, delete_file, install_package and SQL that changes data wait for the "
            "user's approval. If the user declines, do not try the same thing another way; "
            "say what you would have done.",
            "- Use ask_user only when you cannot go on without a decision.",
            "- [secret:NAME] stands for a secret PAW masked (also in the user's message); "
            "its value is in the environment variable NAME: use it from code, never print it.",
            "- Answer concisely in the user's language, with Markdown.",
        ]
        if self.toolbox.datasources:
            lines += ["", *self._datasource_lines()]
        else:
            lines += ["", "No datasources are connected to this conversation."]
        return "\n".join(lines)

    def _datasource_lines(self) -> list[str]:
        lines = ["Datasources (query them with run_sql, by slug):"]
        for source in self.toolbox.datasources.values():
            about = f" — {source.description}" if source.description else ""
            lines.append(f"- {source.slug}: {source.name} ({source.dialect}){about}")
        return lines

    def _sql_prompt(self, allowed: frozenset[str]) -> str:
        lines = [
            "You are PAW's data agent, answering a question about a database with SQL.",
            f"Today is {time.strftime('%Y-%m-%d')}.",
            "",
            "How to work:",
            "- Find the tables you need in what PAW tells you about the datasource"
            + (" and with search_knowledge" if "search_knowledge" in allowed else "")
            + "; then answer with run_sql (one statement per call; a single SELECT, WITH "
            "or EXPLAIN runs at once, anything that changes data waits for the user's "
            "approval).",
            "- The last query you run is shown to the user as the result: make it the one "
            "that answers the question.",
            "- Answer concisely in the user's language, with Markdown, and end with the "
            "final SQL in a ```sql block.",
        ]
        if "ask_user" in allowed:
            lines.append("- Use ask_user only when the question is ambiguous.")
        lines += ["", *self._datasource_lines()]
        return "\n".join(lines)


class _Ask:
    """One question waiting for the host's answer."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.ask_id = uuid.uuid4().hex[:12]
        self.event = threading.Event()
        self.answer = ""


class Run:
    """One submitted prompt, from ``start`` to ``result``. ``execute`` runs on the run's
    own thread; ``cancel`` and ``answer`` are called from the reader thread."""

    def __init__(
        self,
        agent: Agent,
        run_id: str,
        prompt: str,
        stream: RunStream,
        *,
        tools: frozenset[str] | None = None,
        knowledge: Knowledge | None = None,
        attachments: list[str] | None = None,
        vision: bool | None = None,
    ) -> None:
        self.agent = agent
        self.run_id = run_id
        self.prompt = prompt
        self.stream = stream
        #: The model's streamed text as ``delta`` lines, joined when it comes fast.
        self.deltas = DeltaBuffer(
            lambda text: stream.emit("delta", text=text), agent.settings.delta_window
        )
        self.tools = tools  # the submit's ``tools``: the only ones this run may use
        self.knowledge = knowledge  # the submit's ``knowledge``
        # The submit's ``attachments`` (workspace images sent with the prompt) and
        # ``vision`` (the model accepts images; None: the host did not say).
        self.attachments = list(attachments or [])
        self.vision = vision
        self.prompt_images: list[dict[str, Any]] = []  # their content parts, once loaded
        settings = agent.settings
        self.control = RunControl(
            time.monotonic() + settings.timeout if settings.timeout > 0 else None
        )
        self.usage = {"input": 0, "output": 0, "rounds": 0, "estimated": False}
        self.messages: list[dict[str, Any]] = []  # this run's assistant and tool messages
        self.last_text = ""
        self._pending: _Ask | None = None
        self._abandoned = False  # an ask timed out: answers must name their ask_id
        self._ask_lock = threading.Lock()

    # -- ops from the reader thread ----------------------------------------------------

    def cancel(self, reason: str = "cancelled") -> None:
        """Stop the run: the model stream, the tool's process group, a pending question."""
        self.control.stop(reason)

    def answer(self, answers: list[str], ask_id: str | None) -> str | None:
        """Resolve the pending question; returns None on success, else the refusal message
        (python-agent-harness's wording)."""
        with self._ask_lock:
            state = self._pending
            if ask_id is None and self._abandoned:
                return (
                    "answer is ambiguous: a previous question timed out in this run, so "
                    "answers must carry the ask_id from the ask line"
                )
            if state is None:
                return f"no pending question for run {self.run_id}"
            if ask_id is not None and ask_id != state.ask_id:
                return (
                    f"stale answer: ask_id {ask_id} is not the pending question "
                    f"({state.ask_id}) for run {self.run_id}"
                )
            self._pending = None
        if state.kind == "confirm":
            state.answer = answers[0]
        else:
            state.answer = ", ".join(a.strip() for a in answers if a.strip()) or answers[0]
        state.event.set()
        return None

    # -- questions from the run thread -------------------------------------------------

    def _ask(self, kind: str, data: dict[str, Any]) -> str | None:
        state = _Ask(kind)
        with self._ask_lock:
            self._pending = state
        self.stream.notify("ask", {"kind": kind, **data, "ask_id": state.ask_id})
        timeout = self.agent.settings.answer_timeout
        try:
            answered = self.control.wait_event(state.event, timeout if timeout > 0 else None)
        finally:
            with self._ask_lock:
                if self._pending is state:
                    self._pending = None
                    if not state.event.is_set():
                        self._abandoned = True
        return state.answer if answered else None

    def confirm(self, prompt: str, call: dict[str, Any] | None = None) -> bool:
        """Ask the host to approve ``prompt``; True only for an approving answer. ``call``:
        the tool call the confirm is for, exactly as its ``tool_calls`` item will name it
        (``{"name", "args", "input"}``), sent as the confirm's ``call`` so the host can
        hold the approval to that one call."""
        data: dict[str, Any] = {"prompt": prompt}
        if call is not None:
            data["call"] = call
        answer = self._ask("confirm", data)
        return answer is not None and answer.strip().lower() in APPROVE

    def ask(self, questions: list[dict[str, Any]]) -> str | None:
        """Ask the host ``questions``; the answer, or None when unanswered in time."""
        return self._ask("ask", {"questions": questions})

    # -- the run -----------------------------------------------------------------------

    def execute(self) -> dict[str, Any]:
        """Run the prompt, writing ``start`` and the run's lines; return the fields of the
        ``result`` line (the caller writes it). Never raises."""
        extra = {"attachments": list(self.attachments)} if self.attachments else {}
        self.stream.emit("start", prompt=self.prompt, warnings=list(self.agent.warnings), **extra)
        errors: list[dict[str, str]] = []
        cancelled = False
        answer = ""
        try:
            answer = self._loop()
        except Stopped as stop:
            # Nothing the run started may outlive its cancel: a background process of
            # run_python (a Popen the kernel left running), a detached one, the kernel.
            self.agent.stop_tools()
            if stop.reason == "timeout":
                limit = self.agent.settings.timeout
                errors.append(
                    {
                        "code": "timeout",
                        "message": (
                            f"wall-clock limit of {limit:g} s reached (--timeout); the run was stopped"
                        ),
                    }
                )
            else:
                cancelled = True
        except RunFailed as failure:
            errors.append({"code": failure.code, "message": failure.message})
        except ModelError as failure:
            errors.append({"code": failure.code, "message": failure.message})
        except Exception as exc:  # a bug must still end the run cleanly
            traceback.print_exc(file=sys.stderr)
            errors.append({"code": "unknown", "message": f"internal error: {exc!r}"})
        self.control.close()
        for error in errors:
            self.stream.notify("error", error["message"])
        if not answer and (cancelled or errors):
            answer = self.last_text
        self._remember(answer, cancelled, errors)
        return {
            "answer": answer,
            "errors": errors,
            "error_messages": [e["message"] for e in errors],
            "cancelled": cancelled,
            "model": self.agent.model.model,
            "usage": dict(self.usage),
        }

    def _remember(self, answer: str, cancelled: bool, errors: list[dict[str, str]]) -> None:
        if answer:
            text = answer
        elif cancelled:
            text = "[the user cancelled this request before it was answered]"
        else:
            text = f"[no answer: {errors[0]['message'] if errors else 'unknown'}]"
        prompt = self.prompt
        if self.attachments:  # the images are not kept: the memory says they were there
            prompt += "\n\n[Images attached to this message: " + ", ".join(self.attachments) + "]"
        if self.agent.memory.maxlen:
            self.agent.memory.append(Turn(prompt, text))

    def _account(self, completion: Completion) -> None:
        self.usage["input"] += completion.input_tokens
        self.usage["output"] += completion.output_tokens
        self.usage["rounds"] += 1
        self.usage["estimated"] = bool(self.usage["estimated"] or completion.estimated)
        self.stream.notify("usage", dict(self.usage))

    def _call_context(self, call: Any, context: ToolContext, offered: set[str]) -> ToolContext:
        """The context one tool call runs with. Its ``tool_calls`` and ``tool_running``
        lines are written right before it acts: for an approval-gated tool, only once its
        confirm was approved (a host may stop a runtime whose ``tool_calls`` names a gated
        tool without an approved confirm before it), and not at all when it is declined
        or not ``offered`` to this run (it is refused without acting, and a host may stop
        a runtime that calls a tool the run may not use)."""
        announced = False
        # "args": the protocol's short reprs; "input": the values themselves, for a person
        # to read (a host that does not know the key ignores it). A gated tool's confirm
        # names the same item, so the host can match the approval to this call.
        item = {
            "name": call.name,
            "args": display_args(call.arguments),
            "input": full_args(call.arguments),
        }

        def announce() -> None:
            nonlocal announced
            if not announced:
                announced = True
                self.stream.notify("tool_calls", [item])
                self.stream.notify("tool_running", call.name)

        def confirm(prompt: str) -> bool:
            approved = self.confirm(prompt, call=item)
            if approved:
                announce()
            return approved

        if call.name not in GATED and call.name in offered:
            announce()
        return dataclasses.replace(context, confirm=confirm)

    def _on_retry(self, info: dict[str, Any]) -> None:
        self.deltas.flush()
        self.stream.notify("retry", info)

    def _loop(self) -> str:
        settings = self.agent.settings
        toolbox = self.agent.toolbox
        context = ToolContext(
            control=self.control,
            confirm=self.confirm,
            ask=self.ask,
            notify=self.stream.notify,
            allowed=self.tools,
            knowledge=self.knowledge,
            vision=bool(self.vision),
            max_image_bytes=settings.max_image_bytes,
            sql_checks=SqlChecks(retries=settings.sql_retries),
        )
        self._load_attachments()
        tools = toolbox.specs_for(context)
        offered = {spec["function"]["name"] for spec in tools}
        tool_rounds = 0
        while True:
            self.control.check()
            messages = self._fit(tools)
            try:
                completion = self.agent.model.complete(
                    messages,
                    tools,
                    control=self.control,
                    on_text=self.deltas.add,
                    on_retry=self._on_retry,
                )
            finally:
                self.deltas.flush()  # held text goes before any other line of the run
            self._account(completion)
            if completion.text.strip():
                self.last_text = completion.text
            assistant: dict[str, Any] = {"role": "assistant", "content": completion.text or None}
            if completion.tool_calls:
                assistant["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments or "{}"},
                    }
                    for c in completion.tool_calls
                ]
            if not completion.tool_calls:
                if not completion.text.strip():
                    raise RunFailed("no_answer", "the model returned an empty answer")
                return completion.text
            if tool_rounds >= settings.max_rounds:
                raise RunFailed(
                    "budget",
                    (
                        f"round budget exhausted: the model still asked for tools after "
                        f"{settings.max_rounds} tool rounds (--max-rounds {settings.max_rounds})"
                    ),
                )
            tool_rounds += 1
            self.messages.append(assistant)
            self.stream.notify("tool_start", [c.name for c in completion.tool_calls])
            seen: list[tuple[str, dict[str, Any]]] = []  # view_image's images of this round
            for call in completion.tool_calls:
                self.control.check()
                outcome = toolbox.run(
                    call.name, call.arguments, self._call_context(call, context, offered)
                )
                self.stream.notify(
                    "tool",
                    {
                        **outcome.notify_fields(),
                        "name": call.name,
                        "ok": outcome.ok,
                        "summary": outcome.summary,
                    },
                )
                self.messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": outcome.text}
                )
                seen += outcome.images
            if seen:
                # A tool message holds text only: the images come as a user message right
                # after the round's tool results.
                self.messages.append(
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "text",
                                "text": "The image(s) you asked to view: "
                                + ", ".join(name for name, _ in seen),
                            },
                            *(part for _, part in seen),
                        ],
                    }
                )

    def _load_attachments(self) -> None:
        """Read the submit's attachments into image content parts for the prompt's user
        message. Raises :class:`RunFailed` ``model_without_vision`` when the host said the
        model accepts no images, ``attachment`` for a file that cannot be sent (gone, not
        PNG/JPEG/WebP, too large): never a silent drop."""
        if not self.attachments or self.prompt_images:
            return
        if self.vision is False:
            raise RunFailed(
                "model_without_vision",
                f"the model {self.agent.model.model} does not accept images, so "
                + ", ".join(self.attachments)
                + " cannot be sent to it",
            )
        parts = []
        for path in self.attachments:
            try:
                parts.append(
                    image_part(self.agent.workspace, path, self.agent.settings.max_image_bytes)
                )
            except (ImageRefused, OSError) as exc:
                raise RunFailed("attachment", f"cannot send the attached image: {exc}") from exc
        self.prompt_images = parts

    # -- the context budget ------------------------------------------------------------

    def _compose(self) -> list[dict[str, Any]]:
        agent = self.agent
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": agent.system_prompt(self.tools)}
        ]
        context = self.knowledge.context() if self.knowledge is not None else ""
        if context:
            # This run's knowledge: given with the request, never kept in the memory.
            messages.append({"role": "system", "content": context})
        if agent.summary:
            messages.append(
                {
                    "role": "system",
                    "content": "Summary of the earlier conversation:\n" + agent.summary,
                }
            )
        for turn in agent.memory:
            messages.append({"role": "user", "content": turn.prompt})
            messages.append({"role": "assistant", "content": turn.answer})
        if self.prompt_images:
            messages.append(
                {
                    "role": "user",
                    "content": [{"type": "text", "text": self.prompt}, *self.prompt_images],
                }
            )
        else:
            messages.append({"role": "user", "content": self.prompt})
        return messages + self.messages

    def _needed(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> int:
        return (
            estimate_tokens(estimate_text(messages))
            + estimate_tokens(json.dumps(tools))
            + self.agent.settings.max_output_tokens
        )

    def _fit(self, tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages of the next call within the context budget: older turns are
        folded into the summary (then dropped), this run's older tool outputs elided and
        the latest one cut; ``notify compact`` says what was done. Raises
        :class:`RunFailed` (``context``) when even that does not fit."""
        budget = self.agent.settings.context_budget
        messages = self._compose()
        if self._needed(messages, tools) <= budget:
            return messages
        report: dict[str, Any] = {
            "dropped_turns": 0,
            "summarized": False,
            "elided_tool_outputs": 0,
            "cut_tool_output": False,
        }
        memory = self.agent.memory
        dropped: list[Turn] = []
        while memory and self._needed(messages, tools) > budget:
            dropped.append(memory.popleft())
            messages = self._compose()
        if dropped:
            report["dropped_turns"] = len(dropped)
            report["summarized"] = self._summarize(dropped)
            messages = self._compose()
            if self._needed(messages, tools) > budget and self.agent.summary:
                self.agent.summary = ""
                report["summarized"] = False
                messages = self._compose()
        # Then this run's tool outputs, oldest first; the latest is cut rather than dropped.
        tool_messages = [m for m in self.messages if m["role"] == "tool"]
        latest = (
            self.messages[-1] if self.messages and self.messages[-1]["role"] == "tool" else None
        )
        for message in tool_messages:
            if self._needed(messages, tools) <= budget:
                break
            if message is not latest and len(message["content"]) > len(ELIDED):
                message["content"] = ELIDED
                report["elided_tool_outputs"] += 1
                messages = self._compose()
        excess = self._needed(messages, tools) - budget
        if excess > 0 and latest is not None:
            # Tokens are ~3.5 characters (model.estimate_tokens); keep a margin.
            keep = len(latest["content"]) - excess * 4 - 200
            if keep > 200:
                latest["content"] = latest["content"][:keep] + "\n[cut to fit the context budget]"
                report["cut_tool_output"] = True
                messages = self._compose()
        if any(report.values()):
            self.stream.notify("compact", report)
        needed = self._needed(messages, tools)
        if needed > budget:
            raise RunFailed(
                "context",
                (
                    f"the request needs about {needed} tokens (answer included), more than "
                    f"the context budget of {budget} (--context-budget), even without earlier "
                    f"turns"
                ),
            )
        return messages

    def _summarize(self, turns: list[Turn]) -> bool:
        """Fold ``turns`` into the running summary with one model call (counted in usage);
        False when the call failed (the turns are then just dropped)."""
        previous = self.agent.summary
        transcript = "\n\n".join(f"User: {t.prompt}\nAssistant: {t.answer}" for t in turns)
        request = [
            {
                "role": "system",
                "content": (
                    "Summarize this conversation between a user and a data agent in at most 200 "
                    "words: the user's goals, the facts established, the files produced and open "
                    "questions. Plain text."
                ),
            },
            {
                "role": "user",
                "content": ((f"Earlier summary:\n{previous}\n\n" if previous else "") + transcript)[
                    -200_000:
                ],
            },
        ]
        try:
            completion = self.agent.model.complete(
                request,
                None,
                control=self.control,
                stream=False,
                max_tokens=512,
                on_retry=self._on_retry,
            )
        except ModelError as failure:
            if failure.code == "auth":
                raise
            self.stream.notify("error", f"summarizing older turns failed: {failure.message}")
            return False
        self._account(completion)
        self.agent.summary = completion.text.strip()[:SUMMARY_LIMIT]
        return bool(self.agent.summary)
