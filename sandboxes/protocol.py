"""The serve protocol, version 1, from the host's side: parse runtime lines, build ops.

The wire format is fixed by the public ``python-agent-harness`` package (PyPI 1.5.6.6;
see the project's docs/runtime.md, "Protocol extensions"): one JSON object per line, UTF-8, every
line stamped ``"protocol": 1``. Control lines (``ready``, ``pong``, ``hello``, ``error``)
carry no ``seq``/``run_id``; run lines (``start``, ``delta``, ``notify``, ``log``,
``result``) carry ``seq`` (1, 2, 3 … per run) and the ``run_id`` of the submit.

Parsing never raises: a line that is not valid JSON, not an object, or lacks a ``type`` is
returned as :class:`Malformed`, so the host can keep it as a log event and go on.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

#: Protocol versions this host understands (PROTOCOL.md: version 1).
SUPPORTED_VERSIONS = (1,)

RUN_LINE_TYPES = frozenset({"start", "delta", "notify", "log", "result"})
CONTROL_LINE_TYPES = frozenset({"ready", "pong", "hello", "error"})

#: A confirm is approved by an answer whose first item is one of these (PROTOCOL.md).
CONFIRM_YES = "yes"
CONFIRM_NO = "no"

#: The capability of a *gated* runtime (paw-agent's): its risky tools raise a ``notify
#: ask`` of kind ``confirm`` before they act, and do not act unless approved
#: (PROTOCOL.md, "PAW's own runtime"). A runtime whose ``ready`` lacks it is *ungated*: it
#: runs its tools itself and tells the host only afterwards (python-agent-harness 1.5.6.6
#: offers none such: docs/runtime.md, "Ungated runtimes"), so an approval PAW requires
#: cannot come before the call, and PAW can only end the run after it.
APPROVAL_GATE = "approval_gate"


def runtime_gated(capabilities: Iterable[str]) -> bool:
    """Whether a runtime with these ``ready.capabilities`` asks before its risky tools
    act (:data:`APPROVAL_GATE` among them)."""
    return APPROVAL_GATE in capabilities


class ProtocolMismatch(Exception):
    """The runtime speaks a protocol version this host does not know."""


@dataclass(frozen=True)
class Line:
    """A parsed line: ``type`` and the decoded object as received (``raw``)."""

    type: str
    raw: dict[str, Any]


#: Characters of a malformed line that are kept and shown.
MALFORMED_TEXT_CHARS = 4096
#: Characters of a malformed line that are read: more than are kept, so that a secret
#: value cut by the limit is still masked whole before the text is cut (values are at
#: most 8 KiB, ``secrets_vault``).
MALFORMED_READ_CHARS = MALFORMED_TEXT_CHARS + 8192


@dataclass(frozen=True)
class Malformed:
    """A line that is not a protocol object; ``text`` is what was read, up to
    :data:`MALFORMED_READ_CHARS` (the host masks it, then keeps
    :data:`MALFORMED_TEXT_CHARS`)."""

    text: str
    reason: str
    type: str = "malformed"


@dataclass(frozen=True)
class Ready(Line):
    """The first line of a process: ``pid``, ``protocol_version``, ``capabilities``."""

    pid: int | None = None
    protocol_version: int | None = None
    capabilities: tuple[str, ...] = ()


@dataclass(frozen=True)
class ControlLine(Line):
    """``pong``, ``hello`` or ``error``; ``op_id`` echoes the op that caused it."""

    op_id: str | None = None
    error_code: str = ""
    message: str = ""


@dataclass(frozen=True)
class RunLine(Line):
    """A line of a run: ``seq`` (1… per run), ``run_id``, and for notify lines ``kind``
    and ``data``."""

    seq: int | None = None
    run_id: str = ""
    kind: str = ""
    data: Any = None


@dataclass(frozen=True)
class UnknownLine(Line):
    """A well-formed object of an unknown type: relayed as is, never dropped."""


@dataclass(frozen=True)
class Anomaly:
    """Something the host noticed about the stream itself (a ``seq`` gap, a foreign
    ``run_id``): stored as a warning notice next to the lines."""

    message: str
    type: str = "anomaly"


@dataclass(frozen=True)
class HostNotice:
    """A notice of the host's own about its sandbox, stored and sent among the sandbox's
    lines in their order (e.g. ``runtime_ungated`` right after a run's ``start``): a
    ``notice`` event ``{"type": "notice", "level", "code", "message"}``."""

    code: str
    message: str
    level: str = "warning"
    type: str = "notice"


ParsedLine = Ready | ControlLine | RunLine | UnknownLine | Malformed | Anomaly | HostNotice


def _without_nul(value: Any) -> Any:
    """``value`` with every NUL character replaced by U+FFFD: PostgreSQL's ``jsonb`` and
    ``text`` cannot hold NUL, and a line that cannot be stored would be lost."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd")
    if isinstance(value, dict):
        return {_without_nul(k): _without_nul(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_without_nul(item) for item in value]
    return value


def parse_line(text: str | bytes) -> ParsedLine:
    """Parse one line (without its newline). Never raises. NUL characters (raw or escaped
    as ``\\u0000``) come out as U+FFFD."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    text = text.strip().replace("\x00", "\ufffd")
    try:
        obj = json.loads(text)
    except ValueError as exc:
        return Malformed(text=text[:MALFORMED_READ_CHARS], reason=f"not JSON: {exc}")
    if "\\u0000" in text:
        obj = _without_nul(obj)
    if not isinstance(obj, dict):
        return Malformed(text=text[:MALFORMED_READ_CHARS], reason="not a JSON object")
    line_type = obj.get("type")
    if not isinstance(line_type, str) or not line_type:
        return Malformed(text=text[:MALFORMED_READ_CHARS], reason="no type")
    if line_type == "ready":
        caps = obj.get("capabilities")
        return Ready(
            type=line_type,
            raw=obj,
            pid=obj.get("pid") if isinstance(obj.get("pid"), int) else None,
            protocol_version=obj.get("protocol_version")
            if isinstance(obj.get("protocol_version"), int)
            else None,
            capabilities=tuple(c for c in caps if isinstance(c, str))
            if isinstance(caps, list)
            else (),
        )
    if line_type in CONTROL_LINE_TYPES:
        error = obj.get("error") if isinstance(obj.get("error"), dict) else {}
        op_id = obj.get("op_id")
        return ControlLine(
            type=line_type,
            raw=obj,
            op_id=str(op_id) if op_id is not None else None,
            error_code=str(error.get("code") or ""),
            message=str(error.get("message") or obj.get("message") or ""),
        )
    if line_type in RUN_LINE_TYPES:
        seq = obj.get("seq")
        return RunLine(
            type=line_type,
            raw=obj,
            seq=seq if isinstance(seq, int) and not isinstance(seq, bool) else None,
            run_id=str(obj.get("run_id") or ""),
            kind=str(obj.get("kind") or "") if line_type == "notify" else "",
            data=obj.get("data"),
        )
    return UnknownLine(type=line_type, raw=obj)


def check_handshake(ready: Ready) -> None:
    """Accept the runtime's ``ready`` line or raise :class:`ProtocolMismatch`.

    A host must refuse a ``protocol_version`` it does not know, loudly, at the handshake
    (PROTOCOL.md).
    """
    if ready.protocol_version not in SUPPORTED_VERSIONS:
        raise ProtocolMismatch(
            f"the runtime speaks protocol version {ready.protocol_version!r}; "
            f"this PAW understands {', '.join(map(str, SUPPORTED_VERSIONS))}"
        )


@dataclass
class SeqTracker:
    """Checks the ``seq`` of a run's lines: 1, 2, 3 … with no gap and no reordering.

    ``observe(seq)`` returns ``None`` when the line is the expected next one, else a short
    description of the anomaly (a gap of N lines, a repeat, or a line out of order); the
    tracker then resynchronises on the received number.
    """

    expected: int = 1
    anomalies: list[str] = field(default_factory=list)

    def observe(self, seq: int | None) -> str | None:
        if seq is None:
            problem = "a run line without seq"
        elif seq == self.expected:
            self.expected += 1
            return None
        elif seq > self.expected:
            problem = f"{seq - self.expected} line(s) missing before seq {seq}"
        else:
            problem = f"seq {seq} arrived after seq {self.expected - 1} (repeat or reorder)"
        if seq is not None:
            self.expected = max(self.expected, seq + 1)
        self.anomalies.append(problem)
        return problem


def new_op_id(prefix: str) -> str:
    """A fresh ``op_id`` such as ``submit-3f2a…`` (echoed on the error that refuses it)."""
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def encode_op(op: str, **fields: Any) -> bytes:
    """One op as a protocol line: ``{"op": op, **fields}`` + newline, UTF-8.

    ``None`` fields are left out. Raises ``ValueError`` for an unknown op name.
    """
    if op not in {"submit", "answer", "cancel", "ping", "hello", "shutdown", "history", "handover"}:
        raise ValueError(f"unknown op {op!r}")
    body = {"op": op, **{k: v for k, v in fields.items() if v is not None}}
    return (json.dumps(body, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def confirm_answer(approved: bool) -> list[str]:
    """The ``answers`` of an ``answer`` op that approves or declines a confirm."""
    return [CONFIRM_YES if approved else CONFIRM_NO]
