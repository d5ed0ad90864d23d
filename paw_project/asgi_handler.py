"""Django's ASGI handler, running the synchronous middleware chain in one thread hop.

Django's own ``ASGIHandler`` runs middleware in async mode: every ``MiddlewareMixin``
middleware (session, CSRF, auth, messages, security …) then hops to a worker thread and
back for its request and again for its response half, some fifteen hops per request
before the (sync) DRF view runs in yet another. Django's docs note each switch costs
about a millisecond. PAW's HTTP views are synchronous, so this handler loads the
middleware in sync mode and runs the whole chain, view included, in a single hop to the
request's thread (the same per-request ``ThreadSensitiveContext`` thread Django uses, so
database connections and ``request_finished`` cleanup behave exactly as before).

Nothing else changes: the same middleware, views, body spooling (``read_body``),
streaming responses and disconnect handling come from ``ASGIHandler``. An async view
would still work (Django adapts it with ``async_to_sync``), without async concurrency.
Websockets do not pass here (Channels routes them).
"""

from __future__ import annotations

from asgiref.sync import sync_to_async
from django.core.handlers import base
from django.core.handlers.asgi import ASGIHandler
from django.http import HttpRequest, HttpResponseBase


class SyncStackASGIHandler(ASGIHandler):
    """``ASGIHandler`` with the middleware chain loaded and run synchronously."""

    def __init__(self) -> None:
        base.BaseHandler.__init__(self)
        self.load_middleware(is_async=False)

    async def get_response_async(self, request: HttpRequest) -> HttpResponseBase:
        return await sync_to_async(self.get_response, thread_sensitive=True)(request)


def get_sync_stack_asgi_application() -> SyncStackASGIHandler:
    """Like ``django.core.asgi.get_asgi_application``: set Django up, return the handler."""
    import django

    django.setup(set_prefix=False)
    return SyncStackASGIHandler()
