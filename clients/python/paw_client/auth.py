"""Credentials of a :class:`paw_client.Client`: a fixed bearer token (a personal API token
``paw_…``, or a JWT access token), or a JWT pair from a username and password (or a stored
refresh token) that is refreshed before it expires and again when PAW answers 401."""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from typing import Any

#: Refresh a JWT access token this many seconds before it expires.
REFRESH_MARGIN_SECONDS = 30.0


def jwt_expiry(token: str) -> float | None:
    """The ``exp`` claim (Unix seconds) of a JWT, read without checking its signature (the
    server checks it; the client only wants to know when to refresh), or ``None``."""
    parts = token.split(".")
    if len(parts) != 3:
        return None
    padded = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = json.loads(base64.urlsafe_b64decode(padded.encode()))
    except (ValueError, UnicodeDecodeError):
        return None
    exp = claims.get("exp") if isinstance(claims, dict) else None
    return float(exp) if isinstance(exp, (int, float)) else None


class Credentials:
    """Hands out the bearer token to send, refreshing a JWT pair when needed.

    ``call(path, body) -> dict`` posts to PAW without credentials (the client's own
    request function); ``on_refresh(refresh_token)`` is told every new refresh token (PAW
    rotates them: the old one stops working), e.g. to store it. Thread-safe."""

    def __init__(
        self,
        *,
        call: Callable[[str, dict[str, Any]], dict[str, Any]],
        token: str | None = None,
        username: str | None = None,
        password: str | None = None,
        refresh_token: str | None = None,
        on_refresh: Callable[[str], None] | None = None,
    ) -> None:
        self._call = call
        self._fixed = token
        self._username = username
        self._password = password
        self._refresh = refresh_token
        self._on_refresh = on_refresh
        self._access: str | None = None
        self._expires: float | None = None
        self._lock = threading.Lock()

    @property
    def present(self) -> bool:
        """Whether any credentials were given."""
        return bool(self._fixed or self._refresh or (self._username and self._password))

    @property
    def refresh_token(self) -> str | None:
        """The current JWT refresh token (``None`` with a fixed token)."""
        return self._refresh

    def use_pair(self, pair: dict[str, str], *, username: str, password: str) -> None:
        """Use a fresh JWT pair (from a login with ``username`` and ``password``)."""
        with self._lock:
            self._fixed = None
            self._username, self._password = username, password
            self._access, self._refresh = pair["access"], pair["refresh"]
            self._expires = jwt_expiry(self._access)
        if self._on_refresh is not None:
            self._on_refresh(self._refresh)

    def bearer(self) -> str | None:
        """The token for ``Authorization: Bearer …`` (and the websocket), or ``None``.
        Raises :class:`paw_client.errors.AuthenticationFailed` when a login or refresh is
        refused."""
        if self._fixed:
            return self._fixed
        with self._lock:
            soon = time.time() + REFRESH_MARGIN_SECONDS
            if self._access is None or (self._expires is not None and self._expires <= soon):
                self._renew()
            return self._access

    def renew_after_401(self, used: str | None) -> bool:
        """PAW refused ``used``: get a new access token (unless another thread already
        did). ``False`` when there is no way to (a fixed token)."""
        if self._fixed or not self.present:
            return False
        with self._lock:
            if self._access != used and self._access is not None:
                return True
            self._renew()
            return True

    def _renew(self) -> None:
        from paw_client.errors import AuthenticationFailed

        pair = None
        if self._refresh:
            try:
                pair = self._call("/api/auth/token/refresh", {"refresh": self._refresh})
            except AuthenticationFailed:
                if not (self._username and self._password):
                    raise
        if pair is None:
            if not (self._username and self._password):
                raise AuthenticationFailed(
                    "No credentials: give a token or a username and password."
                )
            pair = self._call(
                "/api/auth/token", {"username": self._username, "password": self._password}
            )
        self._access = pair["access"]
        self._expires = jwt_expiry(self._access)
        self._refresh = pair["refresh"]
        if self._on_refresh is not None:
            self._on_refresh(self._refresh)
