"""Django's ASGI handler, tuned for PAW's synchronous HTTP views.

Three costs dominate Django's own ``ASGIHandler`` for sync views (measured with
``bench/api.py``; the numbers are in docs/api.md):

* It runs middleware in async mode: every ``MiddlewareMixin`` middleware (session, CSRF,
  auth, messages, security …) hops to a worker thread and back for its request half and
  again for its response half, some fifteen hops per request before the sync view runs
  in yet another. This handler loads the same middleware in sync mode and runs the whole
  chain, view included, in one hop.
* It gives every request a new ``ThreadSensitiveContext``, so a new OS thread per request,
  and under load dozens of threads fighting for the GIL. This handler keeps a fixed set of
  ``PAW_WEB_THREADS`` single-thread executors per process and gives each request the
  least busy one for all its thread-sensitive work (asgiref's
  ``ThreadSensitiveContext(executor=...)``), so a request's database connection and its
  ``request_finished`` cleanup still happen on one thread, as before.
* Around the view it hops to that thread twice more: for the ``request_started``
  signal's receivers before, and for ``response.close()`` (``request_finished``) after
  the response is sent, and it runs the view and a disconnect listener as two tasks.
  Here ``request_started``, the request, the middleware chain and the view, and for a
  response whose body is already whole ``response.close()``, run in one hop; the
  response is sent afterwards (a streaming one as Django sends it, then closed).

One thing Django's handler gets wrong is fixed: a body sent without ``Content-Length``
(``Transfer-Encoding: chunked``: curl with that header, ``curl -T``, any client that
streams a body of unknown length) reached the view as an empty one, because Django's
multipart parser and DRF take a missing length for zero (Django ticket #35289). By the
time the request is built the body has been read whole (spooled to disk past
``FILE_UPLOAD_MAX_MEMORY_SIZE``) and held to its limit while it arrived
(``paw_project.asgi_limits`` cuts a chunked body off once past it), so its length is
known: :meth:`SyncStackASGIHandler.create_request` declares it as ``CONTENT_LENGTH``.

Nothing else changes: the same middleware, views, signals, body spooling and streaming
responses; a response is still not sent to a client that went away while the view ran.
Websockets do not pass here (Channels); :class:`WebsocketThreads` gives them a fixed set
of threads of their own in the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.http import FileResponse, HttpResponseBase
from django.urls import set_script_prefix


class ThreadSet:
    """``PAW_WEB_THREADS`` single-thread executors named ``paw-<name>-<n>``; :meth:`use`
    runs the block's thread-sensitive work (asgiref's ``ThreadSensitiveContext``) on the
    least busy one."""

    def __init__(self, name: str) -> None:
        count = max(1, settings.PAW_WEB_THREADS)
        self._executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"paw-{name}-{n}")
            for n in range(count)
        ]
        self._busy = [0] * count

    def use(self) -> _Lease:
        """An async context manager: the block's thread-sensitive work runs on the least
        busy executor, counted busy until the block ends."""
        # All of this runs on the event loop: no lock.
        index = min(range(len(self._busy)), key=self._busy.__getitem__)
        return _Lease(self._busy, index, self._executors[index])


class _Lease:
    """One use of a :class:`ThreadSet`'s executor ``index`` (its count in ``busy``), as a
    plain async context manager: an ``asynccontextmanager`` generator closed with the
    request's coroutine (a server that stops with sockets open lets them be collected)
    raised "generator didn't stop after athrow()" instead of letting ``GeneratorExit``
    through."""

    def __init__(self, busy: list[int], index: int, executor: ThreadPoolExecutor) -> None:
        self._busy = busy
        self._index = index
        self._context = ThreadSensitiveContext(executor=executor)

    async def __aenter__(self) -> None:
        self._busy[self._index] += 1
        try:
            await self._context.__aenter__()
        except BaseException:
            self._busy[self._index] -= 1
            raise

    async def __aexit__(self, *exc_info: Any) -> None:
        try:
            await self._context.__aexit__(*exc_info)
        finally:
            self._busy[self._index] -= 1


class SyncStackASGIHandler(ASGIHandler):
    """``ASGIHandler`` with a sync middleware chain run in one hop, on a fixed set of
    ``PAW_WEB_THREADS`` request threads."""

    def __init__(self) -> None:
        base.BaseHandler.__init__(self)
        self.load_middleware(is_async=False)
        self._threads = ThreadSet("web")

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        if scope["type"] != "http":
            raise ValueError(f"Django can only handle ASGI/HTTP connections, not {scope['type']}.")
        async with self._threads.use():
            await self.handle(scope, receive, send)

    async def handle(self, scope: dict[str, Any], receive, send) -> None:
        """Answer one HTTP request: Django's ``ASGIHandler.handle`` with the request's
        sync work in one hop to the request thread (:meth:`respond`).

        While the view runs, the client's disconnect is listened for, as Django does: a
        response is not sent to a client that went away. A streaming response is sent as
        Django sends it (stopped when the client goes away), then closed on the request
        thread (``request_finished``)."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        listener = asyncio.create_task(self.listen_for_disconnect(receive))
        try:
            response = await sync_to_async(self.respond, thread_sensitive=True)(scope, body_file)
            if not response.streaming:  # already closed
                if not listener.done():
                    await self.send_response(response, send)
                return
            sender = asyncio.create_task(self.send_response(response, send))
            await asyncio.wait((listener, sender), return_when=asyncio.FIRST_COMPLETED)
            if not sender.done():  # the client went away: stop sending
                sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender
            await sync_to_async(response.close, thread_sensitive=True)()
        finally:
            listener.cancel()
            try:
                # Django's listener ends with RequestAborted on a disconnect, and with an
                # AssertionError on a message that should not come (re-raised, as Django does).
                with contextlib.suppress(asyncio.CancelledError, RequestAborted):
                    await listener
            finally:
                body_file.close()

    def create_request(self, scope: dict[str, Any], body_file) -> tuple[Any, Any]:
        """Django's ``(request, None)`` or ``(None, error response)``; a request that
        declared no ``Content-Length`` gets the length of the body received (bytes), which
        :meth:`read_body` has read whole by now, so that the multipart parser and DRF's
        parsers read it (they take a missing length for an empty body). A body that
        declared its length is left to Django as before (the server received exactly
        that many bytes)."""
        request, error_response = super().create_request(scope, body_file)
        if request is not None and not request.META.get("CONTENT_LENGTH"):
            size = body_file.seek(0, os.SEEK_END)
            body_file.seek(0)
            if size:
                request.META["CONTENT_LENGTH"] = str(size)
        return request, error_response

    def respond(self, scope: dict[str, Any], body_file) -> HttpResponseBase:
        """On the request thread: ``request_started``, the request (or Django's 400/413
        for one it cannot build), the middleware chain and the view; a response whose body
        is whole is closed at once (``request_finished``: the database connection goes
        back to the pool before the bytes are sent). Returns the response."""
        signals.request_started.send(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        response = error_response if request is None else self.get_response(request)
        response._handler_class = self.__class__
        if isinstance(response, FileResponse):
            # As Django does: the server chunks the body, so read it in large blocks.
            response.block_size = self.chunk_size
        if not response.streaming:
            response.close()
        return response


def get_sync_stack_asgi_application() -> SyncStackASGIHandler:
    """Like ``django.core.asgi.get_asgi_application``: set Django up, return the handler."""
    import django

    django.setup(set_prefix=False)
    return SyncStackASGIHandler()


class WebsocketThreads:
    """ASGI middleware for websockets: each connection does its thread-sensitive work
    (Channels' ``database_sync_to_async``, the session and token lookups of the auth
    middlewares) on one of ``PAW_WEB_THREADS`` threads of its own (the one with the
    fewest open connections), not on the one thread asgiref otherwise shares among all
    of them. With a hundred sockets connecting and resuming at once, their database
    calls queued behind each other there for seconds (``bench/events.py``). Each thread
    holds at most one pooled database connection at a time, as the request threads do.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._threads = ThreadSet("ws")

    async def __call__(self, scope: dict[str, Any], receive, send) -> None:
        async with self._threads.use():
            await self.app(scope, receive, send)
