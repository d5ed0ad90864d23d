"""Login throttling with django-axes: what PAW adds around it.

django-axes counts failed ``authenticate()`` calls per username and IP address and, past
``PAW_LOGIN_FAILURE_LIMIT``, refuses that pair for ``PAW_LOGIN_COOLOFF_MINUTES`` (settings
``AXES_*``). Three pieces of glue make it fit PAW:

* :class:`LockoutBackend` lets ``authenticate()`` calls without a request (management
  commands, tests) through to the next backend instead of raising: a lockout is keyed on
  the client's address, which such calls do not have;
* :func:`mark_lockout_on_django_request`: a DRF view (the JWT token endpoint) passes its
  own ``Request`` to ``authenticate()``, so django-axes flags that wrapper; the flag is
  copied to the Django request, where ``AxesMiddleware`` looks for it;
* :func:`lockout_response`: under ``/api/`` the lockout is the usual error shape,
  ``429 {"detail", "code": "locked_out"}`` with ``Retry-After``.
"""

from __future__ import annotations

from typing import Any

from axes.backends import AxesStandaloneBackend
from axes.helpers import get_cool_off, get_lockout_message
from django.http import HttpRequest, HttpResponse, JsonResponse

LOCKOUT_STATUS = 429


class LockoutBackend(AxesStandaloneBackend):
    """django-axes' lockout check, first in ``AUTHENTICATION_BACKENDS``.

    Refuses (by raising ``PermissionDenied``, which ends ``authenticate()``) a username and
    address pair that is locked out; authenticates nobody itself."""

    def authenticate(
        self,
        request: HttpRequest | None,
        username: str | None = None,
        password: str | None = None,
        **kwargs: Any,
    ) -> None:
        if request is None:
            return None
        return super().authenticate(request, username, password, **kwargs)


def mark_lockout_on_django_request(sender: Any, request: Any = None, **kwargs: Any) -> None:
    """``user_login_failed`` receiver, connected after django-axes' own: when a DRF
    ``Request`` was flagged as locked out, flag the Django request it wraps as well."""
    inner = getattr(request, "_request", None)
    if inner is not None and request.__dict__.get("axes_locked_out"):
        inner.axes_locked_out = True
        inner.axes_credentials = getattr(request, "axes_credentials", None)


def lockout_response(request: HttpRequest, *_: Any, **__: Any) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the response to a locked-out login attempt (429).

    JSON ``{"detail", "code": "locked_out"}`` under ``/api/``, plain text elsewhere (the
    admin login page); ``Retry-After`` gives the cool-off in seconds."""
    message = str(get_lockout_message())
    if request.path.startswith("/api/"):
        response: HttpResponse = JsonResponse(
            {"detail": message, "code": "locked_out"}, status=LOCKOUT_STATUS
        )
    else:
        response = HttpResponse(message, status=LOCKOUT_STATUS, content_type="text/plain")
    cool_off = get_cool_off(request)
    if cool_off:
        response["Retry-After"] = str(int(cool_off.total_seconds()))
    return response
