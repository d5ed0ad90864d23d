"""Domain errors: what services raise when a request cannot be carried out.

Each error carries an HTTP status, a machine ``code`` and a human ``detail``; one place
renders them (``paw_project.exception_handlers`` for the API, the consumers for
websockets) as ``{"detail": "...", "code": "..."}`` plus any ``extra`` fields.
"""

from __future__ import annotations

from typing import Any


class DomainError(Exception):
    """Base class: ``status_code`` (HTTP), ``code`` (machine-readable), ``detail`` (human).

    ``extra`` is a dict of further JSON fields for the error body (for example the budget's
    ``used`` and ``limit``); ``headers`` are added to the HTTP response (``Retry-After``).
    """

    status_code: int = 400
    code: str = "invalid"
    default_detail: str = "The request could not be carried out."

    def __init__(
        self,
        detail: str | None = None,
        *,
        code: str | None = None,
        extra: dict[str, Any] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        self.detail = detail or self.default_detail
        if code:
            self.code = code
        self.extra = extra or {}
        self.headers = headers or {}
        super().__init__(self.detail)

    def as_dict(self) -> dict[str, Any]:
        """The error body: ``{"detail", "code", **extra}`` (``extra`` never replaces
        ``detail`` or ``code``)."""
        extra = {k: v for k, v in self.extra.items() if k not in ("detail", "code")}
        return {"detail": self.detail, "code": self.code, **extra}


class InvalidRequest(DomainError):
    status_code = 400
    code = "invalid"
    default_detail = "The request is invalid."


class Forbidden(DomainError):
    status_code = 403
    code = "forbidden"
    default_detail = "You do not have permission to do this."


class NotFound(DomainError):
    status_code = 404
    code = "not_found"
    default_detail = "Not found."


class Conflict(DomainError):
    status_code = 409
    code = "conflict"
    default_detail = "The request conflicts with the current state."


class PayloadTooLarge(DomainError):
    status_code = 413
    code = "payload_too_large"
    default_detail = "The payload is too large."


class BudgetExhausted(DomainError):
    status_code = 402
    code = "budget_exhausted"
    default_detail = "The token budget is used up."


class TooManyRequests(DomainError):
    status_code = 429
    code = "throttled"
    default_detail = "Too many requests."


class ServiceUnavailable(DomainError):
    status_code = 503
    code = "unavailable"
    default_detail = "The service is temporarily unavailable."


class Unauthenticated(DomainError):
    """401: credentials or a token were given but are not valid (wrong password, revoked,
    expired or already used refresh token)."""

    status_code = 401
    code = "not_authenticated"
    default_detail = "Authentication failed."

    def __init__(self, detail: str | None = None, **kwargs) -> None:
        kwargs.setdefault("headers", {"WWW-Authenticate": 'Bearer realm="api"'})
        super().__init__(detail, **kwargs)
