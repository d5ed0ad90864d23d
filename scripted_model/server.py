"""An OpenAI-compatible HTTP server that answers from a script (see ``script.py``).

Endpoints (the subset of the OpenAI REST API that agent runtimes use, plus two for tests):

- ``POST /v1/chat/completions``: streamed (server-sent events, ``stream_options.include_usage``
  adds the final usage chunk) or not; text and tool calls shaped like OpenAI's
  (https://platform.openai.com/docs/api-reference/chat/streaming).
- ``POST /v1/embeddings``: deterministic vectors (``embeddings.py``), ``input`` a string or
  a list of strings, ``encoding_format`` ``float`` or ``base64``, optional ``dimensions``.
- ``GET /v1/models`` and ``GET /v1/models/<id>``.
- ``GET /_log``: the requests received so far as JSON; ``DELETE /_log`` clears it.
- ``POST /_script``: replace the script (JSON body) and restart its order.

The last two are for tests and have no authentication: ``control=False`` (the offline
demo, which any sandbox on the host can reach) answers 404 for them instead.

Streams use chunked transfer encoding over HTTP/1.1 keep-alive, with TCP_NODELAY, so the
time a client spends is the client's, not Nagle's.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from scripted_model import embeddings
from scripted_model.script import (
    Choice,
    Script,
    ScriptError,
    images_expectation,
    images_text,
    latest_tool_result,
    latest_user_message,
    previous_answer,
    previous_answers,
    received_images,
    tool_output,
)

#: What one image counts for in the estimated usage (tokens; not its base64 length).
IMAGE_TOKENS = 1000

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    429: "rate_limit_error",
}


def _split(text: str, size: int) -> list[str]:
    """``text`` in pieces of ``size`` characters (at least one piece, maybe empty)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _fill_json(value: str, messages: list[dict[str, Any]]) -> str:
    """``value`` with ``{{tool_result_json}}``, ``{{previous_answer_json}}``,
    ``{{prompt_json}}`` (JSON string literals) and ``{{previous_answers_json}}`` (a JSON
    list of strings) replaced by what they name (see ``scripted_model.script``)."""
    fills = {
        "{{tool_result_json}}": lambda: latest_tool_result(messages),
        "{{previous_answer_json}}": lambda: previous_answer(messages),
        "{{prompt_json}}": lambda: latest_user_message(messages)[0] or "",
        "{{previous_answers_json}}": lambda: previous_answers(messages),
    }
    for marker, text in fills.items():
        if marker in value:
            value = value.replace(marker, json.dumps(text(), ensure_ascii=False))
    return value


def _estimate_tokens(text: str) -> int:
    """About 4 characters per token, at least 1: the usual rule of thumb for English."""
    return max(1, len(text) // 4)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Small SSE writes must leave at once; Nagle plus delayed ACK would add ~40 ms.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is ``/_log``, not stderr."""

    # -- plumbing ------------------------------------------------------------------------

    def _send_json(self, status: int, payload: Any, headers: dict[str, str] | None = None) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self._record()
        self.wfile.write(body)

    def _send_error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        self._send_json(
            status,
            {
                "error": {
                    "message": message,
                    "type": ERROR_TYPES.get(status, "server_error"),
                    "param": None,
                    "code": None,
                }
            },
            headers,
        )

    def _read_body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    # -- routes --------------------------------------------------------------------------

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        model = self.server.model
        if path == "/_log" and model.control:
            self._send_json(200, model.log)
        elif path == "/v1/models":
            created = int(model.started)
            self._send_json(
                200,
                {
                    "object": "list",
                    "data": [
                        {
                            "id": name,
                            "object": "model",
                            "created": created,
                            "owned_by": "paw-scripted",
                        }
                        for name in model.script.models
                    ],
                },
            )
        elif path.startswith("/v1/models/"):
            name = path[len("/v1/models/") :]
            if name in model.script.models:
                self._send_json(
                    200,
                    {
                        "id": name,
                        "object": "model",
                        "created": int(model.started),
                        "owned_by": "paw-scripted",
                    },
                )
            else:
                self._send_error(404, f"The model '{name}' does not exist")
        else:
            self._send_error(404, f"no route {path}")

    def do_DELETE(self) -> None:
        if self.path.rstrip("/") == "/_log" and self.server.model.control:
            self.server.model.clear_log()
            self._send_json(200, {"cleared": True})
        else:
            self._send_error(404, f"no route {self.path}")

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/")
        raw = self._read_body()
        if path == "/_script" and self.server.model.control:
            try:
                self.server.model.load(Script.parse(raw))
            except ScriptError as exc:
                self._send_error(400, str(exc))
                return
            self._send_json(200, {"loaded": True})
            return
        if path == "/v1/embeddings":
            self._embeddings(raw)
            return
        if path != "/v1/chat/completions":
            self._send_error(404, f"no route {path}")
            return
        try:
            body = json.loads(raw)
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                raise ValueError("messages must be a list")
        except ValueError as exc:
            self._send_error(400, f"invalid request body: {exc}")
            return
        self._chat(body)

    # -- embeddings ----------------------------------------------------------------------

    def _embeddings(self, raw: bytes) -> None:
        model = self.server.model
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if model.script.api_key is not None and token != model.script.api_key:
            self._send_error(401, "Incorrect API key provided.")
            return
        try:
            body = json.loads(raw)
            texts = body.get("input") if isinstance(body, dict) else None
            texts = [texts] if isinstance(texts, str) else texts
            if (
                not isinstance(texts, list)
                or not texts
                or not all(isinstance(t, str) for t in texts)
            ):
                raise ValueError("input must be a string or a non-empty list of strings")
            dimensions = int(body.get("dimensions") or embeddings.DIMENSIONS)
            if not 1 <= dimensions <= 4096:
                raise ValueError("dimensions must be 1 to 4096")
            encoding_format = body.get("encoding_format") or "float"
            if encoding_format not in ("float", "base64"):
                raise ValueError("encoding_format must be float or base64")
        except (ValueError, TypeError) as exc:
            self._send_error(400, f"invalid request body: {exc}")
            return
        model.record_embeddings({"model": body.get("model"), "input": texts})
        tokens = sum(_estimate_tokens(text) for text in texts)
        self._send_json(
            200,
            {
                "object": "list",
                "model": str(body.get("model") or "scripted-embedding"),
                "data": [
                    {
                        "object": "embedding",
                        "index": index,
                        "embedding": embeddings.encode(
                            embeddings.embed(text, dimensions), encoding_format
                        ),
                    }
                    for index, text in enumerate(texts)
                ],
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
            },
        )

    # -- chat completions ----------------------------------------------------------------

    def _chat(self, body: dict[str, Any]) -> None:
        model = self.server.model
        script = model.script
        self._received = time.monotonic()
        self._entry = entry = {
            "method": "POST",
            "path": "/v1/chat/completions",
            "received": time.time(),
            "stream": bool(body.get("stream")),
            "body": body,
            "authorization": self.headers.get("Authorization"),
            "client_port": self.client_address[1],
            "images": received_images(body.get("messages") or []),
        }
        token = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if script.api_key is not None and token != script.api_key:
            choice = Choice({"error": 401, "message": "Incorrect API key provided."}, "api_key")
        else:
            choice = script.choose(body)
        step = choice.step
        entry["source"] = choice.source
        mismatch = images_expectation(step, entry["images"])
        if mismatch is not None:
            entry["expectation_failed"] = mismatch
            step = {"error": 400, "message": f"scripted model: {mismatch}"}
        try:
            if step.get("delay"):
                time.sleep(float(step["delay"]))
            if step.get("error"):
                status = int(step["error"])
                headers = {}
                if "retry_after" in step:
                    headers["Retry-After"] = str(step["retry_after"])
                entry["status"] = status
                self._send_error(status, step.get("message") or f"scripted error {status}", headers)
            elif body.get("stream"):
                entry["status"] = 200
                self._stream(body, step, entry)
            else:
                entry["status"] = 200
                self._complete(body, step, entry)
        except (BrokenPipeError, ConnectionResetError):
            entry["client_gone"] = True
            self.close_connection = True
        finally:
            self._record()

    _entry: dict[str, Any] | None = None
    _received = 0.0

    def _record(self) -> None:
        """Log the chat request being answered (once), just before the last write of its
        response: a client that has the whole answer always finds the request logged."""
        entry, self._entry = self._entry, None
        if entry is not None:
            entry["duration"] = time.monotonic() - self._received
            self.server.model.record(entry)

    def _answer(self, body: dict[str, Any], step: dict[str, Any]) -> tuple[str, list[dict]]:
        """The text and the tool calls ``[{"id", "name", "arguments": str}]`` of a step."""
        messages = body.get("messages") or []
        text = step.get("text") or ""
        if "{{" in text:
            prompt, _ = latest_user_message(messages)
            result = latest_tool_result(messages)
            text = (
                text.replace("{{prompt}}", prompt or "")
                .replace("{{tool_result}}", result)
                .replace("{{tool_output}}", tool_output(result))
            )
            if "{{images}}" in text:
                text = text.replace("{{images}}", images_text(received_images(messages)))
        calls = []
        for call in step.get("tool_calls") or []:
            arguments = call.get("arguments", {})
            if isinstance(arguments, dict) and any(
                isinstance(v, str) and "_json}}" in v for v in arguments.values()
            ):
                # JSON string literals (valid Python ones too), for code that works on what
                # the previous tool answered, the previous turn's answer or the prompt.
                arguments = {
                    k: _fill_json(v, messages) if isinstance(v, str) else v
                    for k, v in arguments.items()
                }
            if not isinstance(arguments, str):
                arguments = json.dumps(arguments)
            calls.append(
                {
                    "id": call.get("id") or f"call_{uuid.uuid4().hex[:20]}",
                    "name": call["name"],
                    "arguments": arguments,
                }
            )
        return text, calls

    def _usage(
        self, body: dict[str, Any], step: dict[str, Any], text: str, calls: list[dict]
    ) -> dict[str, int] | None:
        if step.get("usage") is False:
            return None
        given = step.get("usage") if isinstance(step.get("usage"), dict) else {}
        messages = body.get("messages") or []
        images = received_images(messages)
        if images:  # an image costs a fixed number of tokens, not its base64 length
            messages = [
                {
                    **m,
                    "content": [
                        p
                        for p in m["content"]
                        if not (isinstance(p, dict) and p.get("type") == "image_url")
                    ],
                }
                if isinstance(m, dict) and isinstance(m.get("content"), list)
                else m
                for m in messages
            ]
        prompt = given.get(
            "prompt_tokens",
            _estimate_tokens(json.dumps(messages) + json.dumps(body.get("tools") or []))
            + IMAGE_TOKENS * len(images),
        )
        completion = given.get(
            "completion_tokens",
            _estimate_tokens(text + "".join(c["name"] + c["arguments"] for c in calls)),
        )
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def _complete(self, body: dict[str, Any], step: dict[str, Any], entry: dict) -> None:
        text, calls = self._answer(body, step)
        if "drop_after" in step:
            entry["dropped"] = True
            self.close_connection = True
            self._record()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        message: dict[str, Any] = {"role": "assistant", "content": text or None}
        if calls:
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in calls
            ]
        payload: dict[str, Any] = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.server.model.script.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None,
                    "finish_reason": step.get("finish_reason")
                    or ("tool_calls" if calls else "stop"),
                }
            ],
        }
        usage = self._usage(body, step, text, calls)
        if usage is not None:
            payload["usage"] = usage
        self._send_json(200, payload)

    def _stream(self, body: dict[str, Any], step: dict[str, Any], entry: dict) -> None:
        text, calls = self._answer(body, step)
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.server.model.script.model,
        }
        chunk_delay = float(step.get("chunk_delay") or 0)

        def event(delta: dict[str, Any], finish: str | None = None) -> bytes:
            chunk = {
                **base,
                "choices": [
                    {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }
            if include_usage:
                chunk["usage"] = None
            return f"data: {json.dumps(chunk)}\n\n".encode()

        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        events = [event({"role": "assistant", "content": ""})]
        pieces = _split(text, step.get("chunk", 16)) if text else []
        drop_after = step.get("drop_after")
        for n, piece in enumerate(pieces):
            if drop_after is not None and n >= drop_after:
                break
            events.append(event({"content": piece}))
        if drop_after is None or drop_after >= len(pieces):
            for index, call in enumerate(calls):
                events.append(
                    event(
                        {
                            "tool_calls": [
                                {
                                    "index": index,
                                    "id": call["id"],
                                    "type": "function",
                                    "function": {"name": call["name"], "arguments": ""},
                                }
                            ]
                        }
                    )
                )
                for piece in _split(call["arguments"], step.get("arg_chunk", 24)):
                    events.append(
                        event({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
                    )
        for n, data in enumerate(events):
            if n and chunk_delay:
                time.sleep(chunk_delay)
            self._chunk(data)
        if drop_after is not None:
            # Cut the connection in the middle of the body: no terminating chunk, no [DONE].
            entry["dropped"] = True
            self.close_connection = True
            self._record()
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        tail = [event({}, step.get("finish_reason") or ("tool_calls" if calls else "stop"))]
        usage = self._usage(body, step, text, calls)
        if include_usage and usage is not None:
            tail.append(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n".encode())
        tail.append(b"data: [DONE]\n\n")
        self._record()
        data = b"".join(tail)
        # The last chunk and the end of the body in one write, so a client that stops
        # reading at [DONE] still finds the whole message and can reuse the connection.
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n0\r\n\r\n")

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    model: ScriptedModel

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up on a kept-alive connection are normal, not worth a traceback."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class ScriptedModel:
    """A scripted OpenAI-compatible model server on a background thread.

    ``script`` is anything :meth:`Script.parse` takes (dict, list, JSON text) or a
    :class:`Script`. Use it as a context manager::

        with ScriptedModel({"responses": ["Hello!"]}) as model:
            client = OpenAI(base_url=model.base_url, api_key="x")

    ``port=0`` picks a free port. ``max_log`` bounds the request log (the oldest entries
    go first; ``None``: keep all, as tests want; ``0``: keep none). ``control=False``
    turns the unauthenticated ``/_log`` and ``/_script`` endpoints off. ``log`` holds one entry per chat request:
    ``{"body", "source", "status", "stream", "received" (epoch s), "duration" (s spent
    answering, delays included), "authorization", "client_port" (the same port on two
    entries = one kept-alive connection), "images" (the image content parts received,
    decoded: ``script.received_images``), ...}``.
    """

    def __init__(
        self,
        script: Any = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_log: int | None = None,
        control: bool = True,
    ) -> None:
        self.script = Script.parse(script if script is not None else [])
        self.host = host
        self.port = port
        self.max_log = max_log
        self.control = control
        self._logged = 0
        self.started = time.time()
        self._log: list[dict[str, Any]] = []
        self._embedding_log: list[dict[str, Any]] = []
        self._log_lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        """``http://HOST:PORT/v1``, what ``OPENAI_BASE_URL`` should be."""
        return f"http://{self.host}:{self.port}/v1"

    @property
    def log(self) -> list[dict[str, Any]]:
        """A copy of the request log, oldest first."""
        with self._log_lock:
            return list(self._log)

    @property
    def requests(self) -> list[dict[str, Any]]:
        """The JSON bodies of the chat requests received, oldest first."""
        return [entry["body"] for entry in self.log]

    def record(self, entry: dict[str, Any]) -> None:
        """Append one entry to the request log (numbered from 1)."""
        with self._log_lock:
            self._logged += 1
            entry["n"] = self._logged
            self._log.append(entry)
            if self.max_log is not None and len(self._log) > self.max_log:
                del self._log[: len(self._log) - self.max_log]

    @property
    def embedding_requests(self) -> list[dict[str, Any]]:
        """The embedding requests received (``{"model", "input": [str]}``), oldest first;
        kept apart from the chat log, bounded like it."""
        with self._log_lock:
            return list(self._embedding_log)

    def record_embeddings(self, entry: dict[str, Any]) -> None:
        """Append one embedding request to its log."""
        with self._log_lock:
            if self.max_log != 0:
                self._embedding_log.append(entry)
            if self.max_log is not None and len(self._embedding_log) > self.max_log:
                del self._embedding_log[: len(self._embedding_log) - self.max_log]

    def clear_log(self) -> None:
        """Forget the requests received so far."""
        with self._log_lock:
            self._log.clear()
            self._logged = 0

    def load(self, script: Any) -> None:
        """Replace the script; its order starts again from the first response."""
        self.script = Script.parse(script)

    def start(self) -> ScriptedModel:
        """Bind and serve on a daemon thread; returns self. Raises ``OSError`` if the port
        is taken."""
        self._server = _Server((self.host, self.port), _Handler)
        self._server.model = self
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"scripted-model-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket (idempotent)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> ScriptedModel:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
