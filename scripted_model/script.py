"""The script of the scripted model: what it answers, in which order, and why.

A script is a JSON document (or the same structure as a Python dict/list):

```
{
  "model": "scripted-model",            # id in responses and /v1/models (default shown)
  "models": ["scripted-model"],         # ids listed by /v1/models (default: [model])
  "api_key": "sk-test",                 # optional: any other bearer token gets HTTP 401
  "responses": [STEP, ...],             # consumed in order, one per request
  "rules": [                            # checked first, in order
    {"match": "average tip", "when_tool": "run_python", "responses": [STEP, ...]}
  ],                                    # (more conditions: when_tool, unless_tool,
                                        #  when_system, unless_system; see below)
  "untooled": STEP,                     # optional: answers requests sent without tools
  "fallback": STEP                      # when nothing else applies (default: a short text)
}
```

A bare list is the same as ``{"responses": [...]}``.

A *rule* applies when its ``match`` regex (``re.search``, case-insensitive unless
``"case": true``) finds the latest user message of the request and each condition it has
holds:

- ``when_tool`` (a name or a list of names): the request offers every one of them;
- ``unless_tool`` (a name or a list): the request offers none of them (a run restricted
  to some tools, e.g. PAW's SQL questions without ``run_python``);
- ``when_system`` (a regex, ``re.MULTILINE``, case as ``match``): it finds the request's
  system messages (what the runtime told the model, e.g. the datasources of the run);
- ``unless_system`` (a regex, likewise): it does not find them.

Rules are stateless: the step used is the number of assistant messages after that user
message (0 for the first round of a turn, 1 after one tool round, ...), so extra calls a
runtime makes elsewhere never shift them. Past the end of a rule's steps, the fallback
answers.

``untooled`` answers every request that carries no ``tools`` (the title and summary
requests runtimes make on the side) without consuming anything; without it those requests
take part in the normal order.

A STEP is a string (a text answer) or an object:

- ``text`` (str): the answer; ``{{prompt}}`` and ``{{tool_result}}`` are replaced by the
  latest user message and the latest tool result of the request; ``{{tool_output}}`` by
  that result without the paragraphs naming the files a call wrote (paw-agent's
  ``figures saved: …`` and ``files written: …``), for an answer that names them itself;
  ``{{images}}`` by what the request's image content parts held (:func:`images_text`:
  media type, bytes and SHA-256 of each, or ``no images``); in a rule's steps,
  ``{{system_match}}`` by what its ``when_system`` found (each match, its first group
  when it has groups, once, joined by ``, ``).
- ``expect_images``: the images the request must carry, in order, as a list of SHA-256
  hex digests of their bytes (or ``{"sha256", "media_type"?}`` objects); ``[]`` means none.
  A request that differs gets HTTP 400 naming what was expected and what came (and its
  log entry ``expectation_failed``), so a runtime that drops or mangles an image fails
  loudly. Every logged request lists its ``images`` either way (:func:`received_images`).
- ``chunk`` (int, default 16): characters per streamed text delta.
- ``tool_calls``: ``[{"name": str, "arguments": dict | str, "id"?: str}]``; streamed as
  OpenAI does (a first delta with id and name, then pieces of ``arguments``). In the
  string values of a dict of arguments, ``{{tool_result_json}}`` is replaced by the latest
  tool result, ``{{previous_answer_json}}`` by the assistant's answer just before the
  latest user message (the previous turn, from the conversation's memory; ``""`` when
  there is none) and ``{{prompt_json}}`` by the latest user message, each as a JSON
  string literal (``"…"``, valid Python too); ``{{previous_answers_json}}`` by every
  earlier answer, newest first, as a JSON list of strings.
- ``arg_chunk`` (int, default 24): characters per streamed arguments piece.
- ``delay`` (s): wait before answering; ``chunk_delay`` (s): wait between stream chunks.
- ``error`` (HTTP status, e.g. 401, 403, 429, 500) with optional ``message`` and
  ``retry_after`` (s, sent as the ``Retry-After`` header).
- ``drop_after`` (int): a streamed answer is cut after that many text chunks (the
  connection is closed without ending the stream); a non-streamed one gets no response.
- ``usage``: ``false`` omits usage; ``{"prompt_tokens", "completion_tokens"}`` overrides
  the default (about 4 characters per token of the request and of the answer).
- ``times`` (int, default 1): how many requests this step answers before the next one.
- ``finish_reason`` (str): overrides ``stop`` / ``tool_calls``.
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCRIPTS_DIR = Path(__file__).resolve().parent / "scripts"
DEFAULT_MODEL = "scripted-model"
DEFAULT_FALLBACK = {"text": "Done."}

STEP_KEYS = {
    "text",
    "chunk",
    "tool_calls",
    "arg_chunk",
    "delay",
    "chunk_delay",
    "error",
    "message",
    "retry_after",
    "drop_after",
    "usage",
    "times",
    "finish_reason",
    "expect_images",
}


RULE_KEYS = {
    "match",
    "case",
    "responses",
    "when_tool",
    "unless_tool",
    "when_system",
    "unless_system",
}


class ScriptError(ValueError):
    """A script that cannot be used (unknown keys, wrong types, bad regex)."""


def _step(raw: Any, where: str) -> dict[str, Any]:
    """One normalized step (a dict with known keys), or :class:`ScriptError`."""
    if isinstance(raw, str):
        return {"text": raw}
    if not isinstance(raw, dict):
        raise ScriptError(f"{where}: a step is a string or an object, not {type(raw).__name__}")
    unknown = set(raw) - STEP_KEYS
    if unknown:
        raise ScriptError(f"{where}: unknown step keys {sorted(unknown)}")
    if "text" in raw and not isinstance(raw["text"], str):
        raise ScriptError(f"{where}: text must be a string")
    for call in raw.get("tool_calls") or []:
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            raise ScriptError(f"{where}: each tool call needs a name")
        if not isinstance(call.get("arguments", {}), dict | str):
            raise ScriptError(f"{where}: tool call arguments are an object or a JSON string")
    expected = raw.get("expect_images", [])
    if not isinstance(expected, list) or not all(
        isinstance(e, str) or (isinstance(e, dict) and isinstance(e.get("sha256"), str))
        for e in expected
    ):
        raise ScriptError(f"{where}: expect_images is a list of SHA-256 digests")
    if "error" in raw and not isinstance(raw["error"], int):
        raise ScriptError(f"{where}: error is an HTTP status code")
    for key, least in (("chunk", 1), ("arg_chunk", 1), ("times", 1), ("drop_after", 0)):
        if key in raw and (not isinstance(raw[key], int) or raw[key] < least):
            raise ScriptError(f"{where}: {key} must be an integer >= {least}")
    return dict(raw)


def _names(raw: Any, where: str) -> tuple[str, ...]:
    """A rule's tool names (``when_tool`` / ``unless_tool``: a name or a list of names)."""
    if raw is None:
        return ()
    names = [raw] if isinstance(raw, str) else raw
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ScriptError(f"{where}: a tool name or a list of tool names")
    return tuple(names)


def _regex(raw: Any, flags: int, where: str) -> re.Pattern[str] | None:
    """A rule's regex (``match``, ``when_system``, ``unless_system``), or None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ScriptError(f"{where}: a regex is a string")
    try:
        return re.compile(raw, flags)
    except re.error as exc:
        raise ScriptError(f"{where}: bad regex: {exc}") from exc


@dataclass
class Rule:
    """Steps chosen by a regex on the latest user message, under conditions on the
    request's tools and system messages (see the module docstring)."""

    pattern: re.Pattern[str]
    steps: list[dict[str, Any]]
    when_tool: tuple[str, ...] = ()
    unless_tool: tuple[str, ...] = ()
    when_system: re.Pattern[str] | None = None
    unless_system: re.Pattern[str] | None = None

    def holds(self, tool_names: set[str], system: str) -> bool:
        """Whether the conditions other than ``match`` hold for a request offering
        ``tool_names`` whose system messages are ``system``."""
        return (
            all(name in tool_names for name in self.when_tool)
            and not any(name in tool_names for name in self.unless_tool)
            and (self.when_system is None or self.when_system.search(system) is not None)
            and (self.unless_system is None or self.unless_system.search(system) is None)
        )

    def step(self, position: int, system: str) -> dict[str, Any]:
        """The step for round ``position`` (it exists), ``{{system_match}}`` filled in."""
        step = self.steps[position]
        text = step.get("text")
        if self.when_system is None or not text or "{{system_match}}" not in text:
            return step
        found = [
            m.group(1) if m.re.groups else m.group(0) for m in self.when_system.finditer(system)
        ]
        return {**step, "text": text.replace("{{system_match}}", ", ".join(dict.fromkeys(found)))}


@dataclass
class Choice:
    """The step answering one request and where it came from (for the log)."""

    step: dict[str, Any]
    source: str


@dataclass
class Script:
    """A parsed script plus its consumption state; thread-safe.

    Build it with :meth:`Script.parse` (dict, list, JSON text) or :meth:`Script.load`
    (a file path or the name of a bundled script such as ``demo``).
    """

    model: str = DEFAULT_MODEL
    models: list[str] = field(default_factory=list)
    api_key: str | None = None
    responses: list[dict[str, Any]] = field(default_factory=list)
    rules: list[Rule] = field(default_factory=list)
    untooled: dict[str, Any] | None = None
    fallback: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_FALLBACK))
    _cursor: int = 0
    _used: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def parse(cls, raw: Any) -> Script:
        """Build a script from a dict, a list of steps or JSON text.

        Raises :class:`ScriptError` on anything malformed, naming where.
        """
        if isinstance(raw, Script):
            return raw
        if isinstance(raw, str | bytes):
            try:
                raw = json.loads(raw)
            except ValueError as exc:
                raise ScriptError(f"script is not valid JSON: {exc}") from exc
        raw = copy.deepcopy(raw)
        if isinstance(raw, list):
            raw = {"responses": raw}
        if not isinstance(raw, dict):
            raise ScriptError("a script is an object or a list of steps")
        unknown = set(raw) - {
            "model",
            "models",
            "api_key",
            "responses",
            "rules",
            "untooled",
            "fallback",
            "description",
        }
        if unknown:
            raise ScriptError(f"unknown script keys {sorted(unknown)}")
        model = raw.get("model") or DEFAULT_MODEL
        rules = []
        for n, rule in enumerate(raw.get("rules") or []):
            if not isinstance(rule, dict) or not isinstance(rule.get("match"), str):
                raise ScriptError(f"rules[{n}]: needs a match regex")
            unknown = set(rule) - RULE_KEYS
            if unknown:
                raise ScriptError(f"rules[{n}]: unknown rule keys {sorted(unknown)}")
            flags = 0 if rule.get("case") else re.IGNORECASE
            steps = [
                _step(s, f"rules[{n}].responses[{i}]")
                for i, s in enumerate(rule.get("responses") or [])
            ]
            rules.append(
                Rule(
                    pattern=_regex(rule["match"], flags, f"rules[{n}]"),
                    steps=steps,
                    when_tool=_names(rule.get("when_tool"), f"rules[{n}].when_tool"),
                    unless_tool=_names(rule.get("unless_tool"), f"rules[{n}].unless_tool"),
                    when_system=_regex(
                        rule.get("when_system"), flags | re.MULTILINE, f"rules[{n}].when_system"
                    ),
                    unless_system=_regex(
                        rule.get("unless_system"),
                        flags | re.MULTILINE,
                        f"rules[{n}].unless_system",
                    ),
                )
            )
        return cls(
            model=model,
            models=list(raw.get("models") or [model]),
            api_key=raw.get("api_key"),
            responses=[
                _step(s, f"responses[{i}]") for i, s in enumerate(raw.get("responses") or [])
            ],
            rules=rules,
            untooled=_step(raw["untooled"], "untooled") if raw.get("untooled") else None,
            fallback=_step(raw["fallback"], "fallback")
            if raw.get("fallback")
            else dict(DEFAULT_FALLBACK),
        )

    @classmethod
    def load(cls, name_or_path: str | Path) -> Script:
        """Read a script file, or a bundled one by name (``demo`` → ``scripts/demo.json``).

        Raises :class:`ScriptError` when neither exists or the content is malformed.
        """
        path = Path(name_or_path)
        if not path.is_file():
            bundled = SCRIPTS_DIR / f"{name_or_path}.json"
            if not bundled.is_file():
                raise ScriptError(f"no script file {name_or_path}")
            path = bundled
        return cls.parse(path.read_text(encoding="utf-8"))

    @property
    def remaining(self) -> int:
        """How many requests the ordered ``responses`` still answer."""
        with self._lock:
            left = sum(s.get("times", 1) for s in self.responses[self._cursor :])
            return left - self._used

    def choose(self, body: dict[str, Any]) -> Choice:
        """The step answering a chat completion request ``body`` (and consume it)."""
        messages = body.get("messages") or []
        tools = body.get("tools") or []
        if not tools and self.untooled is not None:
            return Choice(self.untooled, "untooled")
        prompt, position = latest_user_message(messages)
        tool_names = {(t.get("function") or {}).get("name") for t in tools if isinstance(t, dict)}
        system = system_text(messages)
        for n, rule in enumerate(self.rules):
            if not rule.holds(tool_names, system):
                continue
            if prompt is not None and rule.pattern.search(prompt):
                if position < len(rule.steps):
                    return Choice(rule.step(position, system), f"rules[{n}][{position}]")
                return Choice(self.fallback, f"rules[{n}]:fallback")
        with self._lock:
            if self._cursor < len(self.responses):
                step = self.responses[self._cursor]
                source = f"responses[{self._cursor}]"
                self._used += 1
                if self._used >= step.get("times", 1):
                    self._cursor += 1
                    self._used = 0
                return Choice(step, source)
        return Choice(self.fallback, "fallback")


def message_text(message: dict[str, Any]) -> str:
    """The text of a chat message whose content is a string or a list of parts."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part.get("text", "") if isinstance(part, dict) else str(part) for part in content
        )
    return ""


def system_text(messages: list[dict[str, Any]]) -> str:
    """The text of the request's ``system`` (and ``developer``) messages, joined by
    newlines: what rules' ``when_system`` and ``unless_system`` search."""
    return "\n".join(
        message_text(m)
        for m in messages
        if isinstance(m, dict) and m.get("role") in ("system", "developer")
    )


def latest_user_message(messages: list[dict[str, Any]]) -> tuple[str | None, int]:
    """``(text of the latest user message, assistant messages after it)``."""
    assistants = 0
    for message in reversed(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "assistant":
            assistants += 1
        elif role == "user":
            return message_text(message), assistants
    return None, assistants


#: How the paragraphs of a tool result that only list the files a call wrote begin
#: (paw-agent's run_python result ends with them).
FILES_PARAGRAPHS = ("figures saved: ", "files written: ")


def tool_output(result: str) -> str:
    """``result`` without its paragraphs (blank-line separated) that start with one of
    :data:`FILES_PARAGRAPHS`."""
    kept = [p for p in result.split("\n\n") if not p.startswith(FILES_PARAGRAPHS)]
    return "\n\n".join(kept)


def received_images(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every image content part of ``messages``, in order: ``{"message" (its index),
    "role", "media_type", "bytes", "sha256"}`` for a ``data:`` URL (its bytes decoded), or
    ``{"message", "role", "url"}`` for another URL, or with ``"error"`` when the part is
    malformed (not base64, no URL)."""
    found: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "image_url":
                continue
            entry: dict[str, Any] = {"message": index, "role": message.get("role")}
            image = part.get("image_url")
            url = image.get("url") if isinstance(image, dict) else image
            if not isinstance(url, str) or not url:
                found.append({**entry, "error": "no url"})
                continue
            if not url.startswith("data:"):
                found.append({**entry, "url": url[:200]})
                continue
            header, _, data = url[5:].partition(",")
            media_type, _, encoding = header.partition(";")
            if encoding != "base64":
                found.append({**entry, "media_type": media_type, "error": "not base64"})
                continue
            try:
                raw = base64.b64decode(data, validate=True)
            except (ValueError, binascii.Error):
                found.append({**entry, "media_type": media_type, "error": "bad base64"})
                continue
            found.append(
                {
                    **entry,
                    "media_type": media_type,
                    "bytes": len(raw),
                    "sha256": hashlib.sha256(raw).hexdigest(),
                }
            )
    return found


def images_text(images: list[dict[str, Any]]) -> str:
    """What ``{{images}}`` says: one line per image (``image/png, 1234 bytes, sha256
    <hex>``), or ``no images``."""
    if not images:
        return "no images"
    lines = []
    for image in images:
        if "sha256" in image:
            lines.append(f"{image['media_type']}, {image['bytes']} bytes, sha256 {image['sha256']}")
        else:
            lines.append(image.get("url") or f"an unreadable image ({image.get('error')})")
    return "\n".join(lines)


def images_expectation(step: dict[str, Any], images: list[dict[str, Any]]) -> str | None:
    """Why the ``images`` received break the step's ``expect_images`` (None when they
    match, or when the step expects nothing)."""
    if "expect_images" not in step:
        return None
    expected = [{"sha256": e} if isinstance(e, str) else dict(e) for e in step["expect_images"]]
    ok = len(expected) == len(images) and all(
        image.get("sha256") == want["sha256"].lower()
        and want.get("media_type", image.get("media_type")) == image.get("media_type")
        for want, image in zip(expected, images, strict=False)
    )
    if ok:
        return None
    got = [
        {k: image[k] for k in ("media_type", "sha256", "url", "error") if k in image}
        for image in images
    ]
    return f"expected images {json.dumps(expected)}, received {json.dumps(got)}"


def previous_answers(messages: list[dict[str, Any]]) -> list[str]:
    """The texts of the ``assistant`` messages before the latest user message (the
    earlier turns' answers), newest first; empty ones left out."""
    answers: list[str] = []
    seen_user = False
    for message in reversed(messages):
        role = message.get("role") if isinstance(message, dict) else None
        if role == "user":
            seen_user = True
        elif role == "assistant" and seen_user and message_text(message):
            answers.append(message_text(message))
    return answers


def previous_answer(messages: list[dict[str, Any]]) -> str:
    """The text of the latest ``assistant`` message before the latest user message (the
    answer of the previous turn), or ``""``."""
    answers = previous_answers(messages)
    return answers[0] if answers else ""


def latest_tool_result(messages: list[dict[str, Any]]) -> str:
    """The content of the latest ``tool`` message, or ``""``."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "tool":
            return message_text(message)
    return ""
