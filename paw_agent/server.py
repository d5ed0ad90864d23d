"""The serve protocol v1 server: ops from stdin, lines to stdout (PROTOCOL.md).

Threads: the *reader* (stdin, one op per line, stays live during a run so answers and
cancels land mid-run), one *run* thread per submit, and the main thread, which waits for
the end (``shutdown`` op, stdin EOF, SIGTERM/SIGINT), cancels an active run so its
cancelled ``result`` is written, kills every child process group and returns 0.

Refusals mirror python-agent-harness 1.5.6.6 (``entry/server.py``): an ``error`` line with
code ``protocol`` and the same wording, ``op_id`` echoed. paw-agent adds the ``history``
op: ``{"op": "history", "turns": [{"prompt": str, "answer": str}], "op_id"?}`` replaces
the conversation memory of a fresh process; it writes nothing on success and an ``error``
when a run is active or the payload is malformed. A ``submit`` may add ``tools`` (the only
tool names the run may use), ``knowledge`` (``paw_agent.knowledge``), ``attachments``
(``[{"path": str}]``: workspace images sent with the prompt as image content parts,
``paw_agent.images``) and ``vision`` (bool: the model accepts images; ``view_image`` is
offered only then, and attachments with ``vision: false`` fail the run with code
``model_without_vision``); a malformed one is refused like a missing prompt.

A *spare* (``paw-agent serve --spare --secrets-fd FD``) is started before anybody needs
it, with nothing of a person: no endpoint, key, datasource or secret. It imports the SDK
and builds its HTTP transport right after ``ready`` and refuses ``submit`` and
``history`` until the ``handover`` op (capability ``handover``, offered by spares only):
``{"op": "handover", "project": str, "answer_timeout"?: number, "op_id"?}``. Its
environment variables (the provider's endpoint, key and model, the datasources, the
person's secrets) are then read from the ``--secrets-fd`` pipe, as a normal start reads
them, and ``project`` becomes the workspace. Nothing is written on success (a host
follows it with a ``ping`` to know it is done); an ``error`` when the op is malformed,
the process is no spare or was handed over already, or the pipe cannot be read. A spare
is handed over once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from paw_agent import procs
from paw_agent.agent import Agent, Run, Turn
from paw_agent.knowledge import Knowledge, KnowledgeError
from paw_agent.protocol import CAPABILITIES, PROTOCOL_VERSION, LineWriter, RunStream
from paw_agent.secrets_pipe import read_secrets

DRAIN_TIMEOUT = 5.0  # s a stopping process waits for the active run's result
REAP_EVERY = 5  # s between two collections of adopted processes' exit statuses


class AgentServer:
    """Serves ``agent`` over file descriptors ``stdin_fd`` (ops) and ``writer`` (lines)."""

    def __init__(
        self, agent: Agent, writer: LineWriter, stdin_fd: int = 0, *, spare_fd: int | None = None
    ) -> None:
        self.agent = agent
        self.writer = writer
        self.stdin_fd = stdin_fd
        #: A spare's secrets pipe, read at its hand-over (None: not a spare, or handed over).
        self._spare_fd = spare_fd
        self._awaiting_handover = spare_fd is not None
        self.run: Run | None = None
        self._run_thread: threading.Thread | None = None
        self._guard = threading.Lock()  # run start/finish vs. ops
        self._stop = threading.Event()

    # -- life cycle ---------------------------------------------------------------------

    def serve(self) -> int:
        """Write ``ready``, serve ops until shutdown/EOF/signal, drain, clean up; returns
        the exit code (0)."""
        # Handlers first: a host may signal the moment it has read ``ready``.
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError, OSError):
                signal.signal(sig, self._on_signal)
        self.writer.write(
            {
                "type": "ready",
                "pid": os.getpid(),
                "protocol_version": PROTOCOL_VERSION,
                "capabilities": self.capabilities(),
            }
        )
        threading.Thread(target=self._read_ops, name="paw-agent-reader", daemon=True).start()
        if self.agent.settings.warm or self._awaiting_handover:
            # The SDK's import (~0.5-1 s of CPU) is paid now, while the host is still
            # sending the first submit (or before a spare is needed at all), instead of
            # before the first model call. A spare has no endpoint yet: only the
            # transport is built.
            warm = threading.Thread(
                target=self.agent.model.warm,
                kwargs={"transport_only": self._awaiting_handover},
                name="paw-agent-warm",
                daemon=True,
            )
            warm.start()
        ticks = 0
        while not self._stop.wait(1.0):
            ticks += 1
            if ticks % REAP_EVERY == 0:
                procs.reap_orphans()  # adopted processes that ended on their own
        self._drain()
        self.agent.close()
        return 0

    def capabilities(self) -> list[str]:
        """What ``ready`` and ``hello`` offer: :data:`CAPABILITIES`, plus ``handover``
        while this spare waits for its hand-over."""
        return [*CAPABILITIES, *(("handover",) if self._awaiting_handover else ())]

    def _on_signal(self, signum: int, frame: Any) -> None:
        # A second signal takes the default action (die now) instead of waiting on a drain.
        signal.signal(signum, signal.SIG_DFL)
        self._stop.set()

    def _drain(self) -> None:
        with self._guard:
            run, thread = self.run, self._run_thread
        if run is None or thread is None:
            return
        run.cancel()
        thread.join(DRAIN_TIMEOUT)

    # -- reading ------------------------------------------------------------------------

    def _read_ops(self) -> None:
        # os.read on the raw descriptor: no buffered-reader lock for interpreter shutdown to
        # trip over, and bytes, so a bad UTF-8 op is refused instead of ending the loop.
        buffer = bytearray()
        try:
            while not self._stop.is_set():
                try:
                    block = os.read(self.stdin_fd, 1 << 16)
                except OSError as exc:
                    self.writer.error("protocol", f"cannot read op: {exc}")
                    return
                if not block:  # EOF: the host closed the pipe
                    if buffer.strip():
                        self.handle_line(bytes(buffer))  # a last op without its newline
                    return
                buffer.extend(block)
                while not self._stop.is_set() and (end := buffer.find(b"\n")) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    self.handle_line(line)
        finally:
            self._stop.set()

    def handle_line(self, raw: bytes) -> None:
        """Parse and dispatch one op line; every refusal is an ``error`` line."""
        if not raw.strip():
            return
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            self.writer.error("protocol", f"cannot read op: {exc}")
            return
        try:
            op = json.loads(text)
        except ValueError:
            self.writer.error("protocol", "malformed op line")
            return
        if not isinstance(op, dict) or not isinstance(op.get("op"), str):
            op_id = _op_id(op) if isinstance(op, dict) else None
            self.writer.error("protocol", "op must be an object with a string 'op' field", op_id)
            return
        handler = getattr(self, f"op_{op['op']}", None)
        if handler is None:
            self.writer.error("protocol", f"unknown op: {op['op']}", _op_id(op))
            return
        handler(op)

    # -- ops ----------------------------------------------------------------------------

    def _refuse_before_handover(self, op: dict[str, Any]) -> bool:
        """Refuse ``op`` (an ``error``) when this spare was not handed over yet."""
        if not self._awaiting_handover:
            return False
        self.writer.error(
            "protocol",
            f"{op['op']}: this spare runtime has not been handed over yet",
            _op_id(op),
        )
        return True

    def op_submit(self, op: dict[str, Any]) -> None:
        """Start a run on its own thread; ``start`` acknowledges it."""
        if self._refuse_before_handover(op):
            return
        op_id = _op_id(op)
        run_id = str(op.get("run_id") or "")
        if not run_id:
            self.writer.error("protocol", "submit requires run_id", op_id)
            return
        prompt = op.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            self.writer.error("protocol", "submit requires a non-empty prompt", op_id)
            return
        tools = op.get("tools")
        if tools is not None and (
            not isinstance(tools, list) or not all(isinstance(t, str) for t in tools)
        ):
            self.writer.error("protocol", "submit's tools must be a list of tool names", op_id)
            return
        attachments = op.get("attachments")
        if attachments is not None:
            if not isinstance(attachments, list) or not all(
                isinstance(a, dict) and isinstance(a.get("path"), str) and a["path"].strip()
                for a in attachments
            ):
                self.writer.error(
                    "protocol", 'submit\'s attachments must be a list of {"path": str}', op_id
                )
                return
            attachments = [a["path"] for a in attachments]
        vision = op.get("vision")
        if vision is not None and not isinstance(vision, bool):
            self.writer.error("protocol", "submit's vision must be true or false", op_id)
            return
        knowledge = None
        if op.get("knowledge") is not None:
            try:
                knowledge = Knowledge.from_submit(
                    op["knowledge"], self.agent.workspace.root, os.environ
                )
            except KnowledgeError as exc:
                self.writer.error("protocol", f"submit's knowledge: {exc}", op_id)
                return
        with self._guard:
            if self.run is not None:
                self.writer.error("protocol", "a run is already active", op_id)
                return
            run = Run(
                self.agent,
                run_id,
                prompt,
                RunStream(self.writer, run_id),
                tools=frozenset(tools) if tools is not None else None,
                knowledge=knowledge,
                attachments=attachments,
                vision=vision,
            )
            thread = threading.Thread(
                target=self._execute, args=(run,), name=f"paw-agent-run-{run_id}", daemon=True
            )
            self.run, self._run_thread = run, thread
        thread.start()

    def _execute(self, run: Run) -> None:
        try:
            result = run.execute()
        except Exception as exc:  # a bug must never wedge the server with no result
            result = {
                "answer": "",
                "errors": [{"code": "unknown", "message": repr(exc)}],
                "error_messages": [repr(exc)],
                "cancelled": False,
                "model": self.agent.model.model,
                "usage": dict(run.usage),
            }
        # The result and the end of the run are one step: a submit read right after the
        # result line is accepted, never refused as "a run is already active".
        with self._guard:
            run.stream.emit("result", **result)
            self.run, self._run_thread = None, None

    def op_answer(self, op: dict[str, Any]) -> None:
        """Answer the active run's pending question; silent on success."""
        op_id = _op_id(op)
        run_id = str(op.get("run_id") or "")
        answers = op.get("answers")
        if not isinstance(answers, list) or not answers:
            self.writer.error("protocol", "answer requires a non-empty answers list", op_id)
            return
        ask_id = op.get("ask_id")
        run = self.run
        if run is None or run.run_id != run_id:
            self.writer.error(
                "protocol", f"no pending question for run {run_id or '(missing)'}", op_id
            )
            return
        refusal = run.answer([str(a) for a in answers], str(ask_id) if ask_id is not None else None)
        if refusal:
            self.writer.error("protocol", refusal, op_id)

    def op_cancel(self, op: dict[str, Any]) -> None:
        """Cancel the active run; its ``result`` (``cancelled: true``) acknowledges it."""
        op_id = _op_id(op)
        run_id = str(op.get("run_id") or "")
        run = self.run
        if run is None or run.run_id != run_id:
            self.writer.error("protocol", f"run {run_id or '(missing)'} is not active", op_id)
            return
        run.cancel()

    def op_ping(self, op: dict[str, Any]) -> None:
        """``pong``, echoing ``op_id``."""
        payload: dict[str, Any] = {"type": "pong"}
        if _op_id(op) is not None:
            payload["op_id"] = _op_id(op)
        self.writer.write(payload)

    def op_hello(self, op: dict[str, Any]) -> None:
        """Version negotiation: ``hello`` with our version and capabilities, or an error
        when the host's ``protocol_versions`` do not include 1 (python-agent-harness
        semantics: a hello without a usable version is a greeting)."""
        op_id = _op_id(op)
        raw = op.get("protocol_versions", op.get("protocol_version"))
        candidates = raw if isinstance(raw, list) else ([] if raw is None else [raw])
        versions: list[int] = []
        for value in candidates:
            if isinstance(value, bool):
                continue
            if isinstance(value, int):
                versions.append(value)
            elif isinstance(value, float) and value.is_integer():
                versions.append(int(value))
            elif isinstance(value, str):
                with contextlib.suppress(ValueError):
                    versions.append(int(value.strip()))
        versions = versions or [PROTOCOL_VERSION]
        if PROTOCOL_VERSION not in versions:
            self.writer.error(
                "protocol",
                (
                    f"no shared protocol version: host accepts {sorted(versions)}, "
                    f"this build speaks {PROTOCOL_VERSION}"
                ),
                op_id,
            )
            return
        payload: dict[str, Any] = {
            "type": "hello",
            "protocol_version": PROTOCOL_VERSION,
            "capabilities": self.capabilities(),
            "pid": os.getpid(),
        }
        if op_id is not None:
            payload["op_id"] = op_id
        self.writer.write(payload)

    def op_shutdown(self, op: dict[str, Any]) -> None:
        """Stop reading; the main thread drains the active run and exits 0."""
        self._stop.set()

    def op_handover(self, op: dict[str, Any]) -> None:
        """Give a spare its conversation (capability ``handover``, see the module's
        docstring): the variables of the secrets pipe join the environment, ``project``
        becomes the workspace and ``answer_timeout`` (seconds) the questions' wait; the
        model client (SDK imported, transport built) is kept and pointed at the new
        endpoint. Silent on success."""
        op_id = _op_id(op)
        project = op.get("project")
        if not isinstance(project, str) or not project.strip():
            self.writer.error("protocol", 'handover requires "project": the workspace', op_id)
            return
        answer_timeout = op.get("answer_timeout", self.agent.settings.answer_timeout)
        if isinstance(answer_timeout, bool) or not isinstance(answer_timeout, int | float):
            self.writer.error("protocol", "handover's answer_timeout must be seconds", op_id)
            return
        with self._guard:
            fd, self._spare_fd = self._spare_fd, None
            if fd is None:
                self.writer.error(
                    "protocol",
                    "handover: this runtime is no spare (--spare) or was handed over already",
                    op_id,
                )
                return
            try:
                os.environ.update(read_secrets(fd))
                settings = dataclasses.replace(
                    self.agent.settings,
                    project=Path(project),
                    answer_timeout=max(0.0, float(answer_timeout)),
                )
                agent = Agent(settings, os.environ, model=self.agent.model)
                os.chdir(agent.workspace.root)
            except (OSError, ValueError) as exc:
                self.writer.error("protocol", f"handover failed: {exc}", op_id)
                return
            self.agent = agent
            self._awaiting_handover = False
        threading.Thread(target=agent.model.warm, name="paw-agent-warm", daemon=True).start()

    def op_history(self, op: dict[str, Any]) -> None:
        """Seed the memory with earlier turns (paw-agent's ``history`` capability)."""
        if self._refuse_before_handover(op):
            return
        op_id = _op_id(op)
        turns = op.get("turns")
        if not isinstance(turns, list) or not all(
            isinstance(t, dict)
            and isinstance(t.get("prompt"), str)
            and isinstance(t.get("answer"), str)
            for t in turns
        ):
            self.writer.error(
                "protocol",
                'history requires "turns": a list of {"prompt": str, "answer": str}',
                op_id,
            )
            return
        with self._guard:
            if self.run is not None:
                self.writer.error(
                    "protocol", "history cannot be loaded while a run is active", op_id
                )
                return
            self.agent.seed_history([Turn(t["prompt"], t["answer"]) for t in turns])


def _op_id(op: dict[str, Any]) -> str | None:
    value = op.get("op_id")
    return str(value) if value is not None else None
