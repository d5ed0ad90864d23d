"""The web server: uvicorn serving ``paw_project.asgi``, as ``runpaw`` starts it.

``python -m paw_project.web --host H --port P`` (or ``--fd N``, a listening socket it
inherited, shared by several web processes) is the web process of the Redis mode; the
embedded mode calls :func:`serve` in its own process.

Why uvicorn and not Daphne: Daphne reads a whole request body into memory before the
application sees it (daphne #483), so no limit of PAW's could act before a 2 GiB body
was held. uvicorn (``httptools``) hands the body over as it arrives and stops reading
the socket while the application has not taken the last chunk (64 KiB), so
``paw_project.asgi_limits`` refuses a declared ``Content-Length`` before any byte is
read and cuts a chunked body off as soon as it passes the limit. Channels runs under it
unchanged.

What is set here, and why:

* ``proxy_headers`` off: uvicorn would otherwise take the client address from
  ``X-Forwarded-For`` of any loopback peer; PAW decides that itself (``PAW_NUM_PROXIES``,
  ``PAW_BEHIND_HTTPS_PROXY``), so a client cannot forge its address.
* no access log and no logging setup of uvicorn's own: PAW writes one ``paw.access``
  line per response (``paw_project.access_log``) through Django's logging.
* lifespan off: Channels' router has no ``lifespan`` handler.
* websockets: messages up to :data:`WS_MAX_MESSAGE_BYTES` reach the consumer (which
  answers anything over 64 KiB with an ``error`` and stays open); a larger one closes
  the socket with 1009. Reading pauses until the consumer has taken each message, so a
  socket holds at most one such message. Protocol pings every 20 s (closed with 1011
  when unanswered for 20 s more), on top of PAW's own ``ping`` messages; no compression
  (as under Daphne: it would cost CPU on every streamed event).
* request headers: at most :data:`MAX_HEADER_BYTES` (the request line and headers
  together); more gets ``431`` and the connection is closed (httptools has no limit of
  its own).
* a stop (SIGINT or SIGTERM) closes the listening socket, tells open websockets the
  server is going away (1012), lets running requests finish for up to
  :data:`GRACEFUL_SHUTDOWN_SECONDS`, and returns: the caller then stops whatever else
  it runs (the embedded worker).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import sys
import threading
from collections.abc import Iterator

#: Largest websocket message (bytes) the server accepts; the consumer's own limit is 64 KiB.
WS_MAX_MESSAGE_BYTES = 256 * 1024
#: Seconds between websocket protocol pings, and how long an answer may take.
WS_PING_SECONDS = 20.0
#: Largest request line plus headers (bytes).
MAX_HEADER_BYTES = 64 * 1024
#: Seconds running requests get to finish after a stop, before they are cancelled.
GRACEFUL_SHUTDOWN_SECONDS = 10
#: Seconds an idle keep-alive connection stays open.
KEEP_ALIVE_SECONDS = 5


def listen(host: str, port: int, *, backlog: int = 2048) -> socket.socket:
    """A TCP socket listening on ``host:port`` (``SO_REUSEADDR``, as servers do).

    Raises ``OSError`` (``EADDRINUSE``, ``EACCES`` …) or ``socket.gaierror`` for a host
    that does not resolve."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host.strip("[]"), port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def _http_protocol():
    """uvicorn's httptools protocol with a bound on the request line and headers.

    Two counts, either of which answers 431 and closes the connection:

    - httptools keeps an unfinished request head in its own buffer and calls back only
      once a header is whole, so the bytes are counted as they arrive: while a head is
      still incomplete after a chunk, that chunk counts (at most one read over the limit
      is held);
    - a head that arrives whole in one read never looks incomplete, so the request line
      and the headers are also counted as httptools hands them over, and parsing stops
      (before the application sees the request) once they pass the limit."""
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    class HeadTooLarge(Exception):
        """Raised from a parser callback to stop parsing a head over the limit."""

    class BoundedHeadersProtocol(HttpToolsProtocol):
        _head_pending = True  # the connection waits for (the rest of) a request head
        _head_bytes = 0
        _head_size = 0  # the current head's request line and headers, as parsed
        _head_too_large = False
        _message_completed = False

        def on_message_begin(self) -> None:
            self._head_size = 0
            super().on_message_begin()

        def _count_head(self, size: int) -> None:
            self._head_size += size
            if self._head_size > MAX_HEADER_BYTES:
                self._head_too_large = True
                raise HeadTooLarge()

        def on_url(self, url: bytes) -> None:
            self._count_head(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._count_head(len(name) + len(value) + 4)  # ": " and CRLF
            super().on_header(name, value)

        def send_400_response(self, msg: str) -> None:
            # httptools turns the callback's exception into a parse error, which uvicorn
            # answers with a 400: a head over the limit gets its own status instead.
            if self._head_too_large:
                self._refuse_head()
            else:
                super().send_400_response(msg)

        def _refuse_head(self) -> None:
            if self.cycle is None or self.cycle.response_complete:
                body = b"Request header fields too large."
                self.transport.write(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\n"
                    b"content-type: text/plain; charset=utf-8\r\n"
                    b"content-length: " + str(len(body)).encode() + b"\r\n"
                    b"connection: close\r\n\r\n" + body
                )
            self.transport.close()

        def on_headers_complete(self) -> None:
            self._head_pending = False
            self._head_bytes = 0
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self._head_pending = True
            self._message_completed = True

        def data_received(self, data: bytes) -> None:
            if self.transport.is_closing():
                return  # nothing more is parsed after a 431
            self._message_completed = False
            super().data_received(data)
            if not self._head_pending or self._message_completed:
                return  # a pipelined head begun in this chunk is counted from the next one
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEADER_BYTES and not self.transport.is_closing():
                self._refuse_head()

    return BoundedHeadersProtocol


def _server_class():
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn's server, except that a stop signal only stops the server.

        uvicorn raises the signal again once it has shut down, so that a plain uvicorn
        process ends as if it had not caught it; here the embedded mode still has its
        worker to stop after the server returns (and ``runpaw`` its own handlers)."""

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = {
                signum: signal.signal(signum, self.handle_exit)
                for signum in (signal.SIGINT, signal.SIGTERM)
            }
            try:
                yield
            finally:
                for signum, handler in previous.items():
                    signal.signal(signum, handler)

    return Server


def serve(sock: socket.socket) -> None:
    """Serve PAW on the listening socket ``sock`` until SIGINT or SIGTERM, then return
    (see the module docstring for the shutdown)."""
    import uvicorn

    from paw_project.asgi import application

    config = uvicorn.Config(
        application,
        http=_http_protocol(),
        ws="websockets-sansio",
        loop="uvloop",
        lifespan="off",
        log_config=None,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        ws_max_size=WS_MAX_MESSAGE_BYTES,
        ws_ping_interval=WS_PING_SECONDS,
        ws_ping_timeout=WS_PING_SECONDS,
        ws_per_message_deflate=False,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_SECONDS,
    )
    _server_class()(config).run(sockets=[sock])


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code (1 when it cannot listen)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--fd", type=int, help="an inherited listening socket")
    where.add_argument("--host")
    parser.add_argument("--port", type=int)
    args = parser.parse_args(argv)
    if args.host is not None and args.port is None:
        parser.error("--host needs --port")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paw_project.settings")
    if args.fd is not None:
        sock = socket.socket(fileno=args.fd)
    else:
        try:
            sock = listen(args.host, args.port)
        except OSError as exc:
            print(
                f"Cannot listen on {args.host}:{args.port}: {exc.strerror or exc}.", file=sys.stderr
            )
            return 1
    with sock:
        serve(sock)
    return 0


if __name__ == "__main__":
    sys.exit(main())
