"""What PAW's API answers, as typed objects. Times are timezone-aware ``datetime`` (UTC),
sizes bytes, usage tokens. Every object keeps the JSON it was made from in ``raw``, so a
field a newer PAW adds is reachable before this client knows it."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

T = TypeVar("T")

#: Run statuses after which a run changes no more.
FINISHED_STATUSES = frozenset({"done", "error", "cancelled"})


def parse_time(value: Any) -> datetime | None:
    """An ISO 8601 time from PAW (``2026-11-29T12:00:00.123456Z``) as an aware datetime."""
    if not value:
        return None
    text = str(value)
    if text.endswith("Z"):  # Python 3.10's fromisoformat does not take "Z"
        text = text[:-1] + "+00:00"
    parsed = datetime.fromisoformat(text)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def _build(cls: type[T], data: dict[str, Any], **converters: Any) -> T:
    """``cls`` from the keys of ``data`` that are its fields (``converters`` per field)."""
    values: dict[str, Any] = {}
    for item in dataclasses.fields(cls):  # type: ignore[arg-type]
        if item.name == "raw":
            continue
        key = item.name.rstrip("_")  # from_ → "from"
        if key in data:
            value = data[key]
            values[item.name] = converters[item.name](value) if item.name in converters else value
    return cls(**values, raw=data)  # type: ignore[call-arg]


@dataclass
class User:
    """The signed-in person (``GET /api/auth/me``)."""

    id: int
    username: str
    email: str = ""
    date_joined: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> User:
        return _build(cls, data, date_joined=parse_time)


@dataclass
class ApiToken:
    """A personal API token. ``token`` (the ``paw_…`` value) is set only on the object
    :meth:`paw_client.Client.create_token` returns: PAW shows it once."""

    id: int
    name: str
    prefix: str = ""
    created: datetime | None = None
    last_used: datetime | None = None
    expires: datetime | None = None
    token: str | None = field(default=None, repr=False)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ApiToken:
        return _build(cls, data, created=parse_time, last_used=parse_time, expires=parse_time)


@dataclass
class File:
    """An upload of a conversation: ``size`` in bytes, ``sha256`` hex."""

    id: str
    name: str
    size: int = 0
    sha256: str = ""
    created: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> File:
        return _build(cls, data, created=parse_time)


@dataclass
class Artifact:
    """A file the agent made in the conversation's workspace: ``path`` relative and
    ``/``-separated, ``size`` in bytes, ``content_type`` guessed from the name."""

    path: str
    size: int = 0
    modified: datetime | None = None
    content_type: str = "application/octet-stream"
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Artifact:
        return _build(cls, data, modified=parse_time)

    @property
    def name(self) -> str:
        """The last part of ``path``."""
        return self.path.rsplit("/", 1)[-1]


@dataclass
class Usage:
    """Tokens of a run: ``input`` and ``output`` tokens, ``rounds`` model calls;
    ``estimated`` when the provider sent no counts and PAW estimated them."""

    input: int = 0
    output: int = 0
    rounds: int = 0
    estimated: bool = False
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any] | None) -> Usage:
        return _build(cls, data or {})

    @property
    def total(self) -> int:
        """``input + output`` tokens (what budgets count)."""
        return self.input + self.output


@dataclass
class RunError:
    """One error of a run: ``code`` (``timeout``, ``budget_exceeded``, ``unknown`` …)
    and ``message``."""

    code: str
    message: str = ""

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RunError:
        return cls(code=str(data.get("code", "")), message=str(data.get("message", "")))


@dataclass
class Approval:
    """Something the agent waits for a person to decide. ``kind`` is ``confirm`` (a risky
    action described by ``prompt``: approve or decline) or ``ask`` (``questions``: each
    ``{"question", "options"}``; answer with strings). ``expires`` is the deadline: then a
    confirm is declined and a question answered "Unanswered"."""

    id: str
    run_id: str
    kind: str
    prompt: str = ""
    questions: list[dict[str, Any]] = field(default_factory=list)
    status: str = "pending"
    answers: list[str] | None = None
    decided_by: str | None = None
    via: str | None = None
    conversation_id: str | None = None
    created: datetime | None = None
    expires: datetime | None = None
    decided: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Approval:
        return _build(
            cls, data, created=parse_time, expires=parse_time, decided=parse_time,
            questions=lambda q: list(q or []),
        )  # fmt: skip

    @classmethod
    def from_message(cls, message: dict[str, Any]) -> Approval:
        """From the websocket's ``agent_confirm_request`` message."""
        return cls(
            id=str(message["approval_id"]),
            run_id=str(message.get("run_id") or ""),
            kind=str(message.get("kind") or "confirm"),
            prompt=str(message.get("prompt") or ""),
            questions=list(message.get("questions") or []),
            expires=parse_time(message.get("expires_at")),
            raw=message,
        )

    def seconds_left(self, now: datetime | None = None) -> float | None:
        """Seconds until the deadline (negative once past), or ``None`` without one."""
        if self.expires is None:
            return None
        return (self.expires - (now or datetime.now(UTC))).total_seconds()

    def options(self, index: int = 0) -> list[str]:
        """The option labels of question ``index`` (strings or ``{"label"}`` objects)."""
        if index >= len(self.questions):
            return []
        return [
            o.get("label", "") if isinstance(o, dict) else str(o)
            for o in self.questions[index].get("options") or []
        ]


@dataclass
class Event:
    """One stored event of a run, as the websocket and ``GET …/events`` carry it.

    ``cursor`` orders every event of the conversation; ``event`` is the runtime's line
    (or PAW's ``notice`` / ``policy_violation``) as stored, secrets masked. ``type`` is its
    ``type`` (``start``, ``delta``, ``notify``, ``log``, ``result``, ``notice`` …) and
    ``kind`` the ``notify`` kind (``tool_calls``, ``tool_running``, ``todos``, ``usage`` …)."""

    cursor: int
    run_id: str | None
    event: dict[str, Any]
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Event:
        payload = data.get("event") or {}
        return cls(
            cursor=int(data["cursor"]),
            run_id=str(data["run_id"]) if data.get("run_id") else None,
            event=payload if isinstance(payload, dict) else {"value": payload},
            raw=data,
        )

    @property
    def type(self) -> str:
        return str(self.event.get("type") or "")

    @property
    def kind(self) -> str | None:
        if self.type == "notify":
            return self.event.get("kind")
        return self.event.get("code") if self.type == "notice" else None

    @property
    def data(self) -> Any:
        """A ``notify`` event's ``data``."""
        return self.event.get("data")

    @property
    def text(self) -> str:
        """A ``delta``'s text (``""`` for other events)."""
        return str(self.event.get("text") or "") if self.type == "delta" else ""


@dataclass
class Provider:
    """A model provider offered to the user: ``active`` once its key resolves (else
    ``reason_if_inactive`` says why), its ``models`` and ``default_model``."""

    name: str
    label: str = ""
    active: bool = False
    reason_if_inactive: str = ""
    default_model: str = ""
    models: list[str] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Provider:
        return _build(cls, data)


@dataclass
class Datasource:
    """A database the agent may query in a run (``datasources=["slug"]``)."""

    slug: str
    name: str = ""
    description: str = ""
    dialect: str = ""
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Datasource:
        return _build(cls, data)


@dataclass
class Secret:
    """One of the user's own secrets (names and dates only: values are write-only)."""

    name: str
    description: str = ""
    created_at: datetime | None = None
    updated_at: datetime | None = None
    last_used_at: datetime | None = None
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Secret:
        return _build(
            cls, data, created_at=parse_time, updated_at=parse_time, last_used_at=parse_time
        )


@dataclass
class Turn:
    """One turn of a conversation's history: a run's prompt and answer. ``in_memory`` is
    false for turns the agent forgot (before a session reset)."""

    run_id: str
    prompt: str
    answer: str = ""
    status: str = ""
    errors: list[RunError] = field(default_factory=list)
    created: datetime | None = None
    started: datetime | None = None
    finished: datetime | None = None
    in_memory: bool = True
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Turn:
        return _build(
            cls, data, created=parse_time, started=parse_time, finished=parse_time,
            errors=lambda e: [RunError.from_json(x) for x in e or []],
        )  # fmt: skip


@dataclass
class UsageReport:
    """``GET /api/usage``: ``totals`` (``input_tokens``, ``output_tokens``, ``tokens``,
    ``rounds``, ``runs``), a ``daily`` series, breakdowns ``by_conversation`` and
    ``by_model``, and the ``budget`` (``monthly_limit``, ``used_this_month``,
    ``resets_at``, ``run_limit``; limits of 0 mean unlimited)."""

    from_: str
    to: str
    totals: dict[str, int] = field(default_factory=dict)
    daily: list[dict[str, Any]] = field(default_factory=list)
    by_conversation: list[dict[str, Any]] = field(default_factory=list)
    by_model: list[dict[str, Any]] = field(default_factory=list)
    budget: dict[str, Any] = field(default_factory=dict)
    user: dict[str, Any] = field(default_factory=dict)
    raw: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UsageReport:
        return _build(cls, data)
