"""Request throttles whose every decision is one atomic operation in a shared store.

DRF's ``SimpleRateThrottle`` reads a request history from the cache and writes it back in
a second step, so concurrent requests (threads, or several web processes) read the same
history and all pass: ``5/min`` let 6–7 of 30 simultaneous run starts through. Here the
check and the count are one step of the ``limits`` library's moving window (a sliding
log, the same rule as DRF's: at most N requests in any window of the rate's length):

* with Redis (``PAW_REDIS_URL``): one Lua script per decision, so the limit holds exactly
  across threads, web processes and hosts (keys ``paw:throttle:<scope>/...``);
* in the embedded mode: in this process's memory, under a lock (it is the only process).

Only accepted requests are counted. Rates come from settings read on every request
(``PAW_THROTTLE_*``, e.g. ``"30/min"``), so a change through ``override_settings`` or a
restart applies at once. Over the limit a request gets 429 ``throttled`` with
``Retry-After``: the whole seconds until the oldest counted request leaves the window,
when the next one will pass.

- :class:`RunsThrottle`: run starts per user (``PAW_THROTTLE_RUNS``).
- :class:`AuthThrottle`: register, token and refresh per client IP (``PAW_THROTTLE_AUTH``).
- :class:`UploadsThrottle`: file uploads per user (``PAW_THROTTLE_UPLOADS``).
- :class:`SecretsThrottle`: changes of one's own secrets per user (``PAW_THROTTLE_UPLOADS``).
- :class:`TokensThrottle`: creating and deleting personal API tokens per user
  (``PAW_THROTTLE_AUTH``).
- :class:`PasswordThrottle`: password changes per user (``PAW_THROTTLE_AUTH``): a stolen
  access token cannot be used to guess the current password at speed.

Failed bearer authentications per client address (``PAW_THROTTLE_BAD_TOKENS``) count
failures, not requests: ``accounts.services.bearer_failure_record`` counts each with
:func:`rate_hit` (a valid token is never refused).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import TYPE_CHECKING

from django.conf import settings
from django.http.request import HttpHeaders
from limits.storage import MemoryStorage, MovingWindowSupport, RedisStorage
from rest_framework.request import Request
from rest_framework.throttling import BaseThrottle

from paw_project import metrics

if TYPE_CHECKING:
    # Not at run time: importing DRF's views loads the authentication classes, which use
    # the accounts services, which use this module.
    from rest_framework.views import APIView

KEY_PREFIX = "paw:throttle"
#: Seconds of each rate unit, by its first letter (DRF's rate format).
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}

_store: MovingWindowSupport | None = None
_store_url: str | None = None
_store_lock = threading.Lock()
_memory_lock = threading.Lock()


def store() -> MovingWindowSupport:
    """This process's ``limits`` storage: Redis (``PAW_REDIS_URL``; keys
    ``paw:throttle:<scope>/<ident>``) or memory in the embedded mode. Made on first use,
    and again when ``PAW_REDIS_URL`` changed (tests)."""
    global _store, _store_url
    url = settings.REDIS_URL
    with _store_lock:
        if _store is None or _store_url != url:
            if url:
                import redis

                pool = redis.ConnectionPool.from_url(url)
                _store = RedisStorage(url, connection_pool=pool, key_prefix=KEY_PREFIX)
            else:
                _store = MemoryStorage()
            _store_url = url
        return _store


def parse_rate(rate: str) -> tuple[int, int]:
    """``"<count>/<second|min|hour|day>"`` (DRF's format: the unit's first letter counts;
    ``settings`` refuses anything else at start) as ``(count, seconds)``."""
    count, _, unit = rate.partition("/")
    return int(count), UNIT_SECONDS[unit.strip()[0]]


def rate_hit(rate: str, scope: str, ident: str) -> int | None:
    """Count one request of ``ident`` against ``rate`` in ``scope``, atomically.

    Returns ``None`` when the request is within the rate (it is counted), else the
    seconds (an int, at least 1) until one more would be (nothing is counted)."""
    count, seconds = parse_rate(rate)
    key = f"{scope}/{ident}"
    counter = store()
    if isinstance(counter, MemoryStorage):
        # Its per-key locks are dropped while idle keys expire, when two threads can end up
        # with different locks for one key: one lock for all keeps the decision atomic.
        with _memory_lock:
            accepted = counter.acquire_entry(key, count, seconds)
    else:
        accepted = counter.acquire_entry(key, count, seconds)  # one Lua script
    if accepted:
        return None
    oldest, _counted = counter.get_moving_window(key, count, seconds)
    return max(1, math.ceil(oldest + seconds - time.time()))


def client_address(meta: Mapping[str, str]) -> str:
    """The client address of a request whose WSGI-style ``meta`` holds ``REMOTE_ADDR`` and
    maybe ``HTTP_X_FORWARDED_FOR``: DRF's ``get_ident`` (``X-Forwarded-For`` only as far
    as ``PAW_NUM_PROXIES`` trusts it), for what is not a DRF request (a websocket)."""
    return BaseThrottle().get_ident(SimpleNamespace(META=meta, headers=HttpHeaders(meta)))


def rate_reset(scope: str, ident: str) -> None:
    """Forget what was counted for ``ident`` in ``scope`` (operators and tests)."""
    store().clear(f"{scope}/{ident}")


class _SettingRateThrottle(BaseThrottle):
    """A throttle of ``scope`` whose rate is the Django setting named by ``rate_setting``,
    counted per :meth:`ident`."""

    scope: str = ""
    rate_setting: str = ""

    def __init__(self) -> None:
        self._wait: int | None = None

    def ident(self, request: Request) -> str:
        """What is counted: the client address (DRF's ``get_ident``: ``REMOTE_ADDR``, or
        ``X-Forwarded-For`` as far as ``PAW_NUM_PROXIES`` trusts it)."""
        return self.get_ident(request)

    def allow_request(self, request: Request, view: APIView | None) -> bool:
        self._wait = rate_hit(getattr(settings, self.rate_setting), self.scope, self.ident(request))
        if self._wait is not None:
            metrics.throttled(scope=self.scope)  # counted by scope
        return self._wait is None

    def wait(self) -> int | None:
        """Seconds until the refused request would pass (``Retry-After``)."""
        return self._wait


class _PerUserThrottle(_SettingRateThrottle):
    """Counts per authenticated user; anonymous requests are counted per client IP."""

    def ident(self, request: Request) -> str:
        user = getattr(request, "user", None)
        if user is not None and user.is_authenticated:
            return f"user-{user.pk}"
        return super().ident(request)


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

    def allow_request(self, request: Request, view: APIView | None) -> bool:
        return request.method == "GET" or super().allow_request(request, view)


class SharesThrottle(_PerUserThrottle):
    """Shares made or updated and forks started, per user (``PAW_THROTTLE_UPLOADS``,
    default ``60/min``): each copies a conversation's files. Reads are not counted."""

    scope = "shares"
    rate_setting = "PAW_THROTTLE_UPLOADS"

    def allow_request(self, request: Request, view: APIView | None) -> bool:
        return request.method == "GET" or super().allow_request(request, view)


class ShareForksThrottle(_PerUserThrottle):
    """Forks of shared conversations per user (``PAW_THROTTLE_FORKS``, default
    ``20/day``), besides :class:`SharesThrottle`: each fork copies up to 256 MiB of a
    share's files into a new workspace, so their disk use is bounded per day too."""

    scope = "share_forks"
    rate_setting = "PAW_THROTTLE_FORKS"


class TokensThrottle(_PerUserThrottle):
    """Personal API token creations and deletions per user (``PAW_THROTTLE_AUTH``, default
    ``10/min``); listing them is not counted."""

    scope = "tokens"
    rate_setting = "PAW_THROTTLE_AUTH"

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
