"""A Content-Security-Policy for PAW's own pages (the chat, sign-in, registration, usage).

The agent's answers are sanitized before they reach the page (``conversations.rendering``);
this header is the second line: should anything slip through, the browser still runs only
PAW's own script files (no inline script, no ``eval``), loads nothing from elsewhere,
connects only back to PAW (HTTP and its websocket), and the page cannot be framed.
The admin and the API docs (Swagger UI) keep Django's and drf-spectacular's defaults.
Directives: https://www.w3.org/TR/CSP3/
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps

from django.http import HttpRequest, HttpResponse

HEADER = "Content-Security-Policy"


def policy_for(request: HttpRequest) -> str:
    """The policy of a page served to ``request`` (its host names the websocket origin)."""
    host = request.get_host()
    return "; ".join(
        [
            "default-src 'self'",
            "script-src 'self'",
            "style-src 'self'",
            "img-src 'self' data:",
            f"connect-src 'self' ws://{host} wss://{host}",
            "object-src 'none'",
            "base-uri 'none'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )


def content_security_policy(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
    """Decorate a page view so its responses carry :func:`policy_for`'s policy."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        response = view(request, *args, **kwargs)
        response.setdefault(HEADER, policy_for(request))
        return response

    return wrapped
