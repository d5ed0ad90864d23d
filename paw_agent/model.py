"""Model calls: OpenAI-compatible chat completions through the official ``openai`` SDK.

Configured by ``OPENAI_BASE_URL``, ``OPENAI_API_KEY`` and ``OPENAI_MODEL`` (PROTOCOL.md).
The SDK is loaded after ``ready`` (only the client's modules: :mod:`paw_agent.sdk`;
still ~0.2 s here, and ``ready`` must come within 0.2 s of spawn): on a background
thread right after it (:meth:`ModelClient.warm`, the default), else on the first call. The SDK's own retries
are off: this module retries transient failures itself (connection errors, HTTP
408/409/429/5xx, a stream dropped mid-way) with exponential backoff, honouring
``Retry-After`` (RFC 9110 §10.2.3), so every retry can be announced (``notify retry``)
and a cancel lands during the backoff.
HTTP 401/403 fail at once (code ``auth``): retrying a refused key only burns time.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from paw_agent.control import RunControl, Stopped
from paw_agent.images import estimate_text
from paw_agent.sdk import load_sdk

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
    sdk = load_sdk()

    if isinstance(exc, sdk.APIStatusError):
        status = exc.status_code
        detail = _error_detail(exc)
        if status in (401, 403):
            return _Failure(
                False,
                "auth",
                f"the model provider refused the credentials "
                f"(HTTP {status}): {detail}; check OPENAI_API_KEY",
            )
        if status in RETRYABLE_STATUSES or status >= 500:
            return _Failure(
                True, "unknown", f"HTTP {status}: {detail}", _retry_after(exc.response.headers)
            )
        return _Failure(False, "unknown", f"the model provider answered HTTP {status}: {detail}")
    if isinstance(exc, sdk.APIConnectionError | sdk.httpx.TransportError):
        return _Failure(True, "unknown", f"connection to the model failed: {exc}")
    if isinstance(exc, sdk.OpenAIError):
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

    Requests go through the SDK's generic ``client.post`` (its documented way to call an
    endpoint with a body as is), which keeps the SDK's auth, base URL, timeouts and typed
    HTTP errors, while skipping what costs milliseconds per round here: the resource
    method's deep transform of the messages and a pydantic model per stream chunk. The
    stream is read to its end, so the connection is reused (the SDK's own stream closes
    it right after ``[DONE]``).
    The HTTP exchange runs on the run's own thread; a stop shuts the client's sockets
    down (sockets found through httpcore's public ``trace`` extension), which wakes a
    blocked read at once.
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str | None,
        api_key: str | None,
        stream: bool = True,
        max_output_tokens: int = 4096,
        attempts: int = 4,
        retry_base: float = 0.5,
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
        self._http: Any = None
        self._raw: Any = None
        self._client_lock = threading.Lock()
        self._sockets: weakref.WeakSet[Any] = weakref.WeakSet()
        self._control: RunControl | None = None

    def _build(self, *, transport_only: bool = False) -> None:
        with self._client_lock:
            if self._client is not None:
                return
            sdk = load_sdk()
            if self._http is None:
                # The HTTP client holds no endpoint or key, only the transport: its TLS
                # context (tens of milliseconds to build) and the proxies of the
                # environment (the isolated network's are the same for every sandbox).
                self._http = sdk.DefaultHttpxClient(event_hooks={"request": [self._on_request]})
                self._raw = sdk.httpx.Response
            if transport_only:
                return
            self._client = sdk.OpenAI(
                base_url=self.base_url,
                api_key=self.api_key,
                max_retries=0,
                timeout=sdk.Timeout(self.request_timeout, connect=10.0),
                http_client=self._http,
            )

    def warm(self, *, transport_only: bool = False) -> None:
        """Build the client now (importing the SDK), on the calling thread; a failure is
        left for the first model call to report. A call that comes meanwhile waits for
        this build instead of starting its own. ``transport_only``: import the SDK and
        build the HTTP transport, not the client of an endpoint (a spare runtime, which
        is given its endpoint and key at hand-over: :meth:`configure`)."""
        with contextlib.suppress(Exception):
            self._build(transport_only=transport_only)

    def configure(self, *, model: str, base_url: str | None, api_key: str | None) -> None:
        """Point the client at another endpoint, key and model (a spare runtime's
        hand-over). The HTTP transport built by :meth:`warm` is kept; the SDK client is
        built anew on the next :meth:`warm` or model call. Not during a call or a full
        build; a transport-only :meth:`warm` may still be importing the SDK (it holds the
        build's lock for that long, so this does not take it)."""
        self.model, self.base_url, self.api_key = model, base_url, api_key
        self._client = None

    def _sdk(self, control: RunControl) -> Any:
        """The ``openai.OpenAI`` client, built on first use (one per process, so HTTP
        connections are kept alive across rounds). The first build imports the SDK
        (~0.5 s or more) on a helper thread, so a cancel meanwhile is not held up."""
        if self._client is None:
            control.call(self._build)
        return self._client

    def _on_request(self, request: Any) -> None:
        request.extensions["trace"] = self._trace

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        if event in ("connection.connect_tcp.complete", "connection.start_tls.complete"):
            stream = info.get("return_value")
            sock = stream.get_extra_info("socket") if stream is not None else None
            if sock is not None:
                self._sockets.add(sock)
                control = self._control
                if control is not None and control.stopped:
                    self._shutdown_sockets()

    def _shutdown_sockets(self) -> None:
        """Wake every read blocked on this client's connections (a run was stopped)."""
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def complete(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        *,
        control: RunControl,
        on_text: Callable[[str], None] | None = None,
        on_retry: Callable[[dict[str, Any]], None] | None = None,
        stream: bool | None = None,
        max_tokens: int | None = None,
    ) -> Completion:
        """One model answer to ``messages`` (OpenAI chat format) offering ``tools``.

        Streamed text goes to ``on_text`` as it arrives; ``on_retry`` gets
        ``{"attempt", "max_attempts", "delay" (s), "reason", "partial"}`` before each
        retry (``partial``: text of the failed attempt already went to ``on_text`` and
        must be discarded). Raises :class:`ModelError` (``auth`` at once, ``unknown``
        after the last attempt) and ``Stopped`` when the run is cancelled or times out.
        """
        use_stream = self.stream if stream is None else stream
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "max_tokens": max_tokens or self.max_output_tokens,
        }
        if tools:
            body["tools"] = tools
        if use_stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        try:
            client = self._sdk(control)
        except Stopped:
            raise
        except Exception as exc:  # no API key, a bad base URL: nothing to retry
            failure = _classify(exc)
            raise ModelError(failure.code, failure.message) from exc
        attempt = 0
        while True:
            attempt += 1
            control.check()
            emitted = [False]

            def text_sink(piece: str, emitted: list[bool] = emitted) -> None:
                emitted[0] = True
                if on_text is not None:
                    on_text(piece)

            self._control = control
            try:
                with control.on_stop(self._shutdown_sockets):
                    if use_stream:
                        completion = self._streamed(client, body, control, text_sink)
                    else:
                        completion = self._whole(client, body, text_sink)
            except Stopped:
                raise
            except Exception as exc:
                control.check()  # a read broken by a stop is the stop, not a failure
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
                    on_retry(
                        {
                            "attempt": attempt,
                            "max_attempts": self.attempts,
                            "delay": round(delay, 3),
                            "reason": failure.message,
                            "partial": emitted[0],
                        }
                    )
                control.sleep(delay)
                continue
            finally:
                self._control = None
            if completion.input_tokens == 0 and completion.output_tokens == 0:
                completion.estimated = True
                completion.input_tokens = estimate_tokens(
                    estimate_text(messages) + (json.dumps(tools) if tools else "")
                )
                completion.output_tokens = estimate_tokens(
                    completion.text + "".join(c.name + c.arguments for c in completion.tool_calls)
                )
            return completion

    def _whole(
        self, client: Any, body: dict[str, Any], on_text: Callable[[str], None]
    ) -> Completion:
        response = client.post("/chat/completions", body=body, cast_to=self._raw)
        data = response.json()
        _raise_in_body(data)
        completion = Completion()
        choices = data.get("choices") or []
        message = (choices[0].get("message") or {}) if choices else {}
        completion.text = _text(message.get("content"))
        for n, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            arguments = function.get("arguments") or ""
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            completion.tool_calls.append(
                ToolCall(
                    id=call.get("id") or f"call_{n}",
                    name=function.get("name") or "",
                    arguments=arguments,
                )
            )
        if completion.text:
            on_text(completion.text)
        _take_usage(completion, data.get("usage"))
        return completion

    def _streamed(
        self, client: Any, body: dict[str, Any], control: RunControl, on_text: Callable[[str], None]
    ) -> Completion:
        completion = Completion()
        calls: dict[int, dict[str, str]] = {}
        text: list[str] = []
        response = client.post("/chat/completions", body=body, cast_to=self._raw, stream=True)
        try:
            # Server-sent events (https://html.spec.whatwg.org/multipage/server-sent-events.html):
            # chat chunks are single "data:" lines. Reading to the end of the body (past
            # [DONE]) lets the connection go back to the pool for the next round.
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if not payload or payload == "[DONE]":
                    continue
                control.check()
                chunk = json.loads(payload)
                _raise_in_body(chunk)
                if chunk.get("usage"):
                    _take_usage(completion, chunk["usage"])
                choices = chunk.get("choices") or []
                delta = (choices[0].get("delta") or {}) if choices else {}
                content = delta.get("content")
                if content:
                    text.append(content)
                    on_text(content)
                for call in delta.get("tool_calls") or []:
                    index = call.get("index")
                    if not isinstance(index, int):
                        # No index: a new id starts a new call, else the last one goes on.
                        last = max(calls, default=None)
                        new = last is None or (call.get("id") and call["id"] != calls[last]["id"])
                        index = len(calls) if new else last
                    slot = calls.setdefault(index, {"id": "", "name": "", "arguments": ""})
                    if call.get("id"):
                        slot["id"] = call["id"]
                    function = call.get("function") or {}
                    slot["name"] += function.get("name") or ""
                    slot["arguments"] += function.get("arguments") or ""
        finally:
            response.close()
        completion.text = "".join(text)
        completion.tool_calls = [
            ToolCall(
                id=slot["id"] or f"call_{index}", name=slot["name"], arguments=slot["arguments"]
            )
            for index, slot in sorted(calls.items())
        ]
        return completion


class ProviderError(Exception):
    """An error object inside a 200 response (some providers report failures that way)."""


def _raise_in_body(data: Any) -> None:
    if isinstance(data, dict) and data.get("error"):
        error = data["error"]
        message = error.get("message") if isinstance(error, dict) else str(error)
        raise ProviderError(str(message or "the provider reported an error"))


def _text(content: Any) -> str:
    """Message content as text (a string, or a list of parts with ``text``)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _take_usage(completion: Completion, usage: Any) -> None:
    if isinstance(usage, dict):
        completion.input_tokens = int(usage.get("prompt_tokens") or 0)
        completion.output_tokens = int(usage.get("completion_tokens") or 0)
