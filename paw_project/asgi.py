"""ASGI entry point (served by uvicorn, ``paw_project.web``): HTTP goes to Django,
websockets to the Channels routes.

Routing follows the Channels docs: ``AllowedHostsOriginValidator(AuthMiddlewareStack(
URLRouter(...)))``, with a JWT middleware inside for integrations (``accounts.websocket``),
each connection's database work on a thread of a fixed set (``asgi_handler.WebsocketThreads``).
The websocket routes are collected from ``conversations.routing``. Around it all, one
access line per response or websocket connection (``paw_project.access_log``).
"""

from __future__ import annotations

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paw_project.settings")

from paw_project.asgi_handler import WebsocketThreads, get_sync_stack_asgi_application

# Django must be set up before anything imports models (consumers do). HTTP runs the sync
# middleware chain in one thread hop per request (see paw_project.asgi_handler).
django_asgi_app = get_sync_stack_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from accounts.websocket import JwtAuthMiddleware  # noqa: E402
from conversations.routing import websocket_urlpatterns  # noqa: E402
from paw_project.access_log import AccessLogMiddleware  # noqa: E402
from paw_project.asgi_limits import BodySizeLimitMiddleware  # noqa: E402

application = AccessLogMiddleware(
    ProtocolTypeRouter(
        {
            "http": BodySizeLimitMiddleware(django_asgi_app),
            "websocket": WebsocketThreads(
                AllowedHostsOriginValidator(
                    AuthMiddlewareStack(JwtAuthMiddleware(URLRouter(websocket_urlpatterns)))
                )
            ),
        }
    )
)
