"""The serve protocol v1 on the wire: constants and line writing.

Source of the rules: ``PROTOCOL.md`` (PAW's copy of the wire format of
``python-agent-harness`` 1.5.6.6, ``entry/server.py`` and ``entry/headless.py``). Every
line is one JSON object carrying ``"protocol": 1``; run lines add ``seq`` (from 1 per run)
and ``run_id``; nothing follows a run's ``result``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

PROTOCOL_VERSION = 1

#: What python-agent-harness 1.5.6.6 says in ``ready.capabilities``, in its order
#: (PROTOCOL.md): paw-agent offers all of them, in the same order, then its own.
HARNESS_CAPABILITIES = (
    "submit",
    "answer",
    "cancel",
    "ping",
    "shutdown",
    "ask_id",
    "usage_notify",
    "error_codes",
    "per_run_budget",
    "signal_drain",
    "hello",
    "op_id",
)
CAPABILITIES = (
    *HARNESS_CAPABILITIES,
    # paw-agent extensions (PROTOCOL.md: "ready.capabilities includes what it adds"):
    "history",  # op {"op": "history", "turns": [{"prompt", "answer"}]} seeds memory
    "approval_gate",  # risky tools raise notify ask kind "confirm" before they act
    "tool_notify",  # notify kind "tool" carries {"name", "ok", "summary"}
    "submit_tools",  # submit's "tools": the only tools the run may use
    "knowledge",  # submit's "knowledge": entries for the prompt, indexes for search_knowledge
    "sql_result",  # notify "tool" of run_sql carries "sql_result" (columns, rows, row_count)
    "tool_output",  # notify "tool" carries "output" (stdout, stderr, error), "files", "table"
    "images",  # submit's "attachments" (images sent with the prompt) and "vision"
)


class LineWriter:
    """Writes protocol lines to a file descriptor: one JSON object per line, written
    whole under a lock and unbuffered (``os.write``), so lines from the reader and run
    threads never interleave. A host that went away (broken pipe) is ignored."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.lock = threading.RLock()

    def write(self, payload: dict[str, Any]) -> None:
        """Write ``payload`` (plus ``"protocol": 1``) as one line."""
        with self.lock:
            self.write_locked({"protocol": PROTOCOL_VERSION, **payload})

    def write_locked(self, line: dict[str, Any]) -> None:
        """Write ``line`` as is; the caller holds :attr:`lock`."""
        data = (json.dumps(line, ensure_ascii=False, default=str) + "\n").encode("utf-8", "replace")
        try:
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]
        except OSError:
            pass  # the host is gone; the reader sees EOF and the process ends

    def error(self, code: str, message: str, op_id: str | None = None) -> None:
        """An ``error`` control line: ``{"error": {"code", "message"}, "message"}``, echoing
        ``op_id`` when the refused op carried one."""
        payload: dict[str, Any] = {
            "type": "error",
            "error": {"code": code, "message": message},
            "message": message,
        }
        if op_id is not None:
            payload["op_id"] = op_id
        self.write(payload)


class RunStream:
    """The lines of one run: numbers them (``seq`` from 1), stamps ``run_id`` and seals the
    stream after ``result`` so a straggler can never write behind it."""

    def __init__(self, writer: LineWriter, run_id: str) -> None:
        self._writer = writer
        self.run_id = run_id
        self._seq = 0
        self._sealed = False

    def emit(self, line_type: str, /, **fields: Any) -> None:
        """Write a run line of type ``line_type`` with ``fields`` (dropped once sealed)."""
        with self._writer.lock:
            if self._sealed:
                return
            self._seq += 1
            self._writer.write_locked(
                {
                    "seq": self._seq,
                    "type": line_type,
                    **fields,
                    "run_id": self.run_id,
                    "protocol": PROTOCOL_VERSION,
                }
            )
            if line_type == "result":
                self._sealed = True

    def notify(self, kind: str, data: Any = None) -> None:
        """A ``notify`` line of ``kind`` with ``data``."""
        self.emit("notify", kind=kind, data=data)


class DeltaBuffer:
    """A model call's streamed text as ``delta`` lines, joined when it comes faster than
    ``window`` seconds apart (issue 16: lines, not tokens).

    A piece that comes after a quiet moment (nothing written for ``window``) is written at
    once, so a stream slower than one piece per ``window`` (a model's usual 20–100 pieces
    a second) gets one line per piece with no delay. Pieces that come within ``window``
    of the last line are held and written together: by the next piece once ``window`` has
    passed, else by a helper thread at the window's end. No piece waits longer than
    ``window`` (plus a thread wake-up); a flood of pieces becomes one line per ``window``
    instead of one per piece, which is what every later step (the node's reader, the live
    log, the sockets) pays for. ``window`` 0 writes every piece as it comes.

    ``write(text)`` writes one line (``RunStream.emit("delta", text=…)``).
    :meth:`flush` writes what is held; the run calls it before any other line of its own
    (a tool call, a retry notice, the result) and when the model call ends, so order is
    kept. Thread-safe.
    """

    def __init__(self, write: Any, window: float) -> None:
        self._write = write
        self.window = max(0.0, window)
        self._held: list[str] = []
        self._deadline = 0.0
        self._last = float("-inf")
        self._lock = threading.Condition()
        self._flusher: threading.Thread | None = None

    def add(self, piece: str) -> None:
        """Write ``piece`` now, or hold it to go with the next ones (see the class)."""
        if not piece:
            return
        with self._lock:
            now = time.monotonic()
            if self._held:
                self._held.append(piece)
                if now >= self._deadline:
                    self._write_held(now)
            elif now - self._last >= self.window:
                self._last = now
                self._write(piece)
            else:
                self._held.append(piece)
                self._deadline = self._last + self.window
                if self._flusher is None:
                    self._flusher = threading.Thread(
                        target=self._flush_loop, name="paw-agent-deltas", daemon=True
                    )
                    self._flusher.start()
                self._lock.notify()

    def flush(self) -> None:
        """Write what is held, if anything (one line)."""
        with self._lock:
            if self._held:
                self._write_held(time.monotonic())

    def _write_held(self, now: float) -> None:
        text = "".join(self._held)
        self._held.clear()
        self._last = now
        self._write(text)

    def _flush_loop(self) -> None:
        with self._lock:
            while True:
                if not self._held:
                    # Idle for a second: the thread ends (the next held piece starts one).
                    if not self._lock.wait(1.0) and not self._held:
                        self._flusher = None
                        return
                    continue
                now = time.monotonic()
                if now >= self._deadline:
                    self._write_held(now)
                else:
                    self._lock.wait(self._deadline - now)
