"""ASGI entry point (Daphne): HTTP goes to Django, websockets to the Channels routes.

Routing follows the Channels docs: ``AllowedHostsOriginValidator(AuthMiddlewareStack(
URLRouter(...)))``. The websocket routes are collected from ``conversations.routing``.
"""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paw_project.settings")

# Django must be set up before anything imports models (consumers do).
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from conversations.routing import websocket_urlpatterns  # noqa: E402
from paw_project.asgi_limits import BodySizeLimitMiddleware  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": BodySizeLimitMiddleware(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(
            AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
        ),
    }
)
