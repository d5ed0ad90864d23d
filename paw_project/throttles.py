"""Request throttles (DRF) kept in the shared cache, so a limit holds across web processes.

Rates come from settings read on every request (``PAW_THROTTLE_*``, e.g. ``"30/min"``), so a
change through ``override_settings`` or a restart applies at once. Over the limit a request
gets 429 ``throttled`` with ``Retry-After`` (seconds).

- :class:`RunsThrottle`: run starts per user (``PAW_THROTTLE_RUNS``).
- :class:`AuthThrottle`: register, token and refresh per client IP (``PAW_THROTTLE_AUTH``).
- :class:`UploadsThrottle`: file uploads per user (``PAW_THROTTLE_UPLOADS``).
- :class:`SecretsThrottle`: changes of one's own secrets per user (``PAW_THROTTLE_UPLOADS``).
- :class:`PasswordThrottle`: password changes per user (``PAW_THROTTLE_AUTH``): a stolen
  access token cannot be used to guess the current password at speed.
"""

from __future__ import annotations

from django.conf import settings
from rest_framework.request import Request
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView


class _SettingRateThrottle(SimpleRateThrottle):
    """A throttle whose rate is the Django setting named by ``rate_setting``."""

    rate_setting: str = ""

    def get_rate(self) -> str:
        return getattr(settings, self.rate_setting)


class _PerUserThrottle(_SettingRateThrottle):
    """Counts per authenticated user; anonymous requests are counted per client IP."""

    def get_cache_key(self, request: Request, view: APIView) -> str:
        ident = (
            str(request.user.pk)
            if request.user and request.user.is_authenticated
            else self.get_ident(request)
        )
        return self.cache_format % {"scope": self.scope, "ident": ident}


class RunsThrottle(_PerUserThrottle):
    """Run starts per user (``PAW_THROTTLE_RUNS``, default ``30/min``)."""

    scope = "runs"
    rate_setting = "PAW_THROTTLE_RUNS"


class UploadsThrottle(_PerUserThrottle):
    """File uploads per user (``PAW_THROTTLE_UPLOADS``, default ``60/min``)."""

    scope = "uploads"
    rate_setting = "PAW_THROTTLE_UPLOADS"


class SecretsThrottle(_PerUserThrottle):
    """Secret changes per user (``PAW_THROTTLE_UPLOADS``, default ``60/min``)."""

    scope = "secrets"
    rate_setting = "PAW_THROTTLE_UPLOADS"

    def allow_request(self, request: Request, view: APIView) -> bool:
        return request.method == "GET" or super().allow_request(request, view)


class PasswordThrottle(_PerUserThrottle):
    """Password changes per user (``PAW_THROTTLE_AUTH``, default ``10/min``)."""

    scope = "password"
    rate_setting = "PAW_THROTTLE_AUTH"


class AuthThrottle(_SettingRateThrottle):
    """Register, token and refresh calls per client IP (``PAW_THROTTLE_AUTH``, default
    ``10/min``), signed in or not: it slows password guessing from one address.

    The IP is ``REMOTE_ADDR`` unless ``PAW_NUM_PROXIES`` trusts that many proxies'
    ``X-Forwarded-For`` entries (DRF ``NUM_PROXIES``)."""

    scope = "auth"
    rate_setting = "PAW_THROTTLE_AUTH"

    def get_cache_key(self, request: Request, view: APIView) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
