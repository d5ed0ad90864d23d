"""Model calls: OpenAI-compatible chat completions through the official ``openai`` SDK.

Configured by ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` (PROTOCOL.md).
The SDK is imported on the first call (``import openai`` takes ~0.5 s here and ``ready``
must come within 0.2 s of spawn). The SDK's own retries are off: this module retries
transient failures itself (connection errors, HTTP 408/409/429/5xx, a stream dropped
mid-way) with exponential backoff, honouring ``Retry-After`` (RFC 9110 §10.2.3), so every
retry can be announced (``notify retry``) and a cancel lands during the backoff.
HTTP 401/403 fail at once (code ``auth``): retrying a refused key only burns time.
"""

from __future__ import annotations

import json
import queue
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sandboxes.runtime.control import RunControl, Stopped

# OpenAI's own convention for retryable statuses (openai-python ``_should_retry``).
RETRYABLE_STATUSES = {408, 409, 429}
MAX_RETRY_AFTER = 60.0  # s: a longer Retry-After is capped, not obeyed


def estimate_tokens(text: str) -> int:
    """A rough token count of ``text``: ~3.5 characters per token (English and code), at
    least 1 for non-empty text. Used for the context budget and when the provider omits
    usage; never billed as exact (``estimated`` marks it)."""
    return (len(text) * 2 + 6) // 7 if text else 0


class ModelError(Exception):
    """A model call that failed for good: ``code`` (``auth`` or ``unknown``) and a message
    for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass
class ToolCall:
    """One tool call the model asked for; ``arguments`` is the raw JSON text."""

    id: str
    name: str
    arguments: str


@dataclass
class Completion:
    """One model answer: text, tool calls and token usage (``estimated`` when the provider
    sent none)."""

    text: str = ""
    tool_calls: list[ToolCall] = field(default_factory=list)
    input_tokens: int = 0
    output_tokens: int = 0
    estimated: bool = False


@dataclass
class _Failure:
    retry: bool
    code: str
    message: str
    retry_after: float | None = None


def _retry_after(headers: Any) -> float | None:
    """Seconds from ``retry-after-ms`` (OpenAI) or ``Retry-After`` (seconds form)."""
    if headers is None:
        return None
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value:
            try:
                return min(MAX_RETRY_AFTER, max(0.0, float(value) * scale))
            except ValueError:
                continue  # an HTTP-date: fall back to our own backoff
    return None


def _classify(exc: BaseException) -> _Failure:
    """Whether ``exc`` from the SDK or the transport is worth a retry, and its code."""
    import httpx
    import openai

    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        detail = _error_detail(exc)
        if status in (401, 403):
            return _Failure(False, "auth", f"the model provider refused the credentials "
                                           f"(HTTP {status}): {detail}; check OPENAI_API_KEY")
        if status in RETRYABLE_STATUSES or status >= 500:
            return _Failure(True, "unknown", f"HTTP {status}: {detail}",
                            _retry_after(exc.response.headers))
        return _Failure(False, "unknown", f"the model provider answered HTTP {status}: {detail}")
    if isinstance(exc, openai.APIConnectionError | httpx.TransportError):
        return _Failure(True, "unknown", f"connection to the model failed: {exc}")
    if isinstance(exc, openai.OpenAIError):
        message = str(exc)
        code = "auth" if "api_key" in message else "unknown"
        return _Failure(False, code, message)
    return _Failure(False, "unknown", f"model call failed: {type(exc).__name__}: {exc}")


def _error_detail(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            return str(inner["message"])[:300]
    return str(getattr(exc, "message", exc))[:300]


class ModelClient:
    """Chat completions with tools against one OpenAI-compatible endpoint.

    ``model`` is the model name; ``base_url``/``api_key`` None means the SDK's defaults
    and environment. ``attempts`` counts the first try; ``retry_base`` (s) doubles per
    retry, with jitter, capped at 30 s.
    """

    def __init__(
        self, *, model: str, base_url: str | None, api_key: str | None, stream: bool = True,
        max_output_tokens: int = 4096, attempts: int = 4, retry_base: float = 0.5,
        request_timeout: float = 600.0,
    ) -> None:
        self.model = model
        self.base_url = base_url
        self.api_key = api_key
        self.stream = stream
        self.max_output_tokens = max_output_tokens
        self.attempts = max(1, attempts)
        self.retry_base = retry_base
        self.request_timeout = request_timeout
        self._client: Any = None
        self._client_lock = threading.Lock()

    def _sdk(self) -> Any:
        """The ``openai.OpenAI`` client, built on first use (one per process, so HTTP
        connections are kept alive across rounds)."""
        with self._client_lock:
            if self._client is None:
                import openai

                self._client = openai.OpenAI(
                    base_url=self.base_url, api_key=self.api_key, max_retries=0,
                    timeout=openai.Timeout(self.request_timeout, connect=10.0),
                )
            return self._client

    def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, *,
        control: RunControl, on_text: Callable[[str], None] | None = None,
        on_retry: Callable[[dict[str, Any]], None] | None = None,
        stream: bool | None = None, max_tokens: int | None = None,
    ) -> Completion:
        """One model answer to ``messages`` (OpenAI chat format) offering ``tools``.

        Streamed text goes to ``on_text`` as it arrives; ``on_retry`` gets
        ``{"attempt", "max_attempts", "delay" (s), "reason", "partial"}`` before each
        retry (``partial``: text of the failed attempt already went to ``on_text`` and
        must be discarded). Raises :class:`ModelError` (``auth`` at once, ``unknown``
        after the last attempt) and ``Stopped`` when the run is cancelled or times out.
        """
        use_stream = self.stream if stream is None else stream
        kwargs: dict[str, Any] = {
            "model": self.model, "messages": messages,
            "max_tokens": max_tokens or self.max_output_tokens,
        }
        if tools:
            kwargs["tools"] = tools
        attempt = 0
        while True:
            attempt += 1
            control.check()
            emitted: list[bool] = [False]

            def text_sink(piece: str, emitted: list[bool] = emitted) -> None:
                emitted[0] = True
                if on_text is not None:
                    on_text(piece)

            try:
                if use_stream:
                    completion = self._streamed(kwargs, control, text_sink)
                else:
                    completion = self._whole(kwargs, control, text_sink)
            except Stopped:
                raise
            except Exception as exc:
                failure = _classify(exc)
                if not failure.retry:
                    raise ModelError(failure.code, failure.message) from exc
                if attempt >= self.attempts:
                    raise ModelError(
                        failure.code,
                        f"model call failed after {attempt} attempts: {failure.message}",
                    ) from exc
                delay = failure.retry_after
                if delay is None:
                    delay = min(30.0, self.retry_base * 2 ** (attempt - 1))
                    delay *= random.uniform(0.8, 1.0)
                if on_retry is not None:
                    on_retry({"attempt": attempt, "max_attempts": self.attempts,
                              "delay": round(delay, 3), "reason": failure.message,
                              "partial": emitted[0]})
                control.sleep(delay)
                continue
            if completion.input_tokens == 0 and completion.output_tokens == 0:
                completion.estimated = True
                completion.input_tokens = estimate_tokens(
                    json.dumps(messages) + (json.dumps(tools) if tools else ""))
                completion.output_tokens = estimate_tokens(
                    completion.text + "".join(c.name + c.arguments
                                              for c in completion.tool_calls))
            return completion

    def _whole(self, kwargs: dict[str, Any], control: RunControl,
               on_text: Callable[[str], None]) -> Completion:
        def request() -> Any:
            return self._sdk().chat.completions.create(**kwargs)

        response = control.call(request)
        completion = Completion()
        if response.choices:
            message = response.choices[0].message
            completion.text = message.content or ""
            for n, call in enumerate(message.tool_calls or []):
                completion.tool_calls.append(ToolCall(
                    id=call.id or f"call_{n}", name=call.function.name or "",
                    arguments=call.function.arguments or ""))
        if completion.text:
            on_text(completion.text)
        if response.usage is not None:
            completion.input_tokens = response.usage.prompt_tokens or 0
            completion.output_tokens = response.usage.completion_tokens or 0
        return completion

    def _streamed(self, kwargs: dict[str, Any], control: RunControl,
                  on_text: Callable[[str], None]) -> Completion:
        # The HTTP stream is read on a helper thread and handed over through a queue, so
        # the run thread can leave the moment it is cancelled, whatever the socket does.
        chunks: queue.Queue[tuple[str, Any]] = queue.Queue()
        holder: dict[str, Any] = {}

        def reader() -> None:
            try:
                stream = self._sdk().chat.completions.create(
                    **kwargs, stream=True, stream_options={"include_usage": True})
                holder["stream"] = stream
                for chunk in stream:
                    if holder.get("abandoned"):
                        break
                    chunks.put(("chunk", chunk))
                chunks.put(("end", None))
            except BaseException as exc:  # handed to the run thread
                chunks.put(("error", exc))

        def abandon() -> None:
            holder["abandoned"] = True
            stream = holder.get("stream")
            if stream is not None:
                stream.close()

        threading.Thread(target=reader, name="paw-agent-model", daemon=True).start()
        completion = Completion()
        calls: dict[int, dict[str, str]] = {}
        text: list[str] = []
        with control.on_stop(abandon):
            while True:
                kind, item = control.get(chunks)
                if kind == "end":
                    break
                if kind == "error":
                    raise item
                if item.usage is not None:
                    completion.input_tokens = item.usage.prompt_tokens or 0
                    completion.output_tokens = item.usage.completion_tokens or 0
                if not item.choices:
                    continue
                delta = item.choices[0].delta
                if delta is None:
                    continue
                if delta.content:
                    text.append(delta.content)
                    on_text(delta.content)
                for call in delta.tool_calls or []:
                    index = call.index if isinstance(call.index, int) else len(calls)
                    slot = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                    if call.id:
                        slot["id"] = call.id
                    if call.function is not None:
                        slot["name"] += call.function.name or ""
                        slot["arguments"] += call.function.arguments or ""
        completion.text = "".join(text)
        completion.tool_calls = [
            ToolCall(id=slot["id"] or f"call_{index}", name=slot["name"],
                     arguments=slot["arguments"])
            for index, slot in sorted(calls.items())
        ]
        return completion
