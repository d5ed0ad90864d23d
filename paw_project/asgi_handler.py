"""Django's ASGI handler, tuned for PAW's synchronous HTTP views.

Two costs dominate Django's own ``ASGIHandler`` for sync views (measured with
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

Nothing else changes: the same middleware, views, body spooling, streaming responses and
disconnect handling come from ``ASGIHandler``. Websockets do not pass here (Channels);
:class:`WebsocketThreads` gives them a fixed set of threads of their own in the same way.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from asgiref.sync import ThreadSensitiveContext, sync_to_async
from django.conf import settings
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase


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

    @contextlib.asynccontextmanager
    async def use(self) -> AsyncIterator[None]:
        # All of this runs on the event loop: no lock.
        index = min(range(len(self._busy)), key=self._busy.__getitem__)
        self._busy[index] += 1
        try:
            async with ThreadSensitiveContext(executor=self._executors[index]):
                yield
        finally:
            self._busy[index] -= 1


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

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


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
