"""Typed errors: every error PAW answers becomes one of these, carrying PAW's ``code`` and
``detail`` (PAW's error body is always ``{"detail": "human sentence", "code": "machine_code"}``,
plus fields such as ``used``/``limit`` for a budget).

The class is chosen by ``code`` first (``budget_exhausted`` → :class:`BudgetExhausted`,
``run_active`` → :class:`RunActive` …), then by HTTP status (404 → :class:`NotFound` …), so
``except PawError`` catches all of them and ``except Conflict`` catches ``RunActive`` too.
"""

from __future__ import annotations

from typing import Any


class PawError(Exception):
    """An error answered by PAW (or met on the way to it).

    ``status``: the HTTP status (0 when no answer came, e.g. a connection failure);
    ``code``: PAW's machine code (``not_found``, ``throttled`` …); ``detail``: its human
    sentence; ``body``: the whole error body (a dict, possibly with more fields)."""

    default_code = "error"

    def __init__(
        self,
        detail: str,
        *,
        code: str | None = None,
        status: int = 0,
        body: dict[str, Any] | None = None,
    ) -> None:
        self.detail = detail
        self.code = code or self.default_code
        self.status = status
        self.body = body or {"detail": detail, "code": self.code}
        super().__init__(f"{self.code}: {detail}")


class InvalidRequest(PawError):
    """400: bad input (``fields`` has the messages per input field, when PAW gave them)."""

    default_code = "invalid"

    @property
    def fields(self) -> dict[str, list[str]]:
        return self.body.get("fields") or {}


class ProviderInactive(InvalidRequest):
    """400 ``provider_inactive``: the chosen model provider has no key (or is disabled)."""


class AuthenticationFailed(PawError):
    """401: no credentials, wrong ones, or an expired or revoked token."""

    default_code = "not_authenticated"


class BudgetExhausted(PawError):
    """402 ``budget_exhausted``: the month's token budget is used up. ``used`` and
    ``limit`` are tokens; ``resets_at`` is an ISO 8601 time (UTC)."""

    default_code = "budget_exhausted"

    @property
    def used(self) -> int | None:
        return self.body.get("used")

    @property
    def limit(self) -> int | None:
        return self.body.get("limit")

    @property
    def resets_at(self) -> str | None:
        return self.body.get("resets_at")


class PermissionDenied(PawError):
    """403: not allowed (e.g. the staff API for a non-staff token)."""

    default_code = "forbidden"


class NotFound(PawError):
    """404: no such object for this user (another person's objects are 404s too)."""

    default_code = "not_found"


class Conflict(PawError):
    """409: conflicts with the current state."""

    default_code = "conflict"


class RunActive(Conflict):
    """409 ``run_active``: the conversation already has a run going on."""


class ApprovalClosed(Conflict):
    """409 ``approval_closed``: the approval was already decided, or it expired."""


class PayloadTooLarge(PawError):
    """413 ``payload_too_large``: the upload is over the server's limit."""

    default_code = "payload_too_large"


class RateLimited(PawError):
    """429 (``throttled``, ``locked_out``): too many requests; ``retry_after`` is the
    number of seconds PAW asked to wait (its ``Retry-After`` header), or ``None``."""

    default_code = "throttled"

    def __init__(self, detail: str, *, retry_after: float | None = None, **kwargs: Any) -> None:
        super().__init__(detail, **kwargs)
        self.retry_after = retry_after


class ServerError(PawError):
    """5xx: PAW failed (or is unavailable); the request may be retried later."""

    default_code = "server_error"


class ConnectionFailed(PawError):
    """No answer from PAW: it could not be reached, or the websocket kept failing to
    reconnect. ``status`` is 0."""

    default_code = "connection_failed"


class ApprovalRequired(PawError):
    """A run waits for a person's decision and no ``on_approval`` callback was given.

    ``approval`` is the :class:`paw_client.models.Approval`; answer it with
    ``run.approve()``, ``run.decline()`` or ``run.answer([...])``, then go on reading
    ``run.events()`` (or ``run.wait()``): nothing is lost or repeated meanwhile."""

    default_code = "approval_required"

    def __init__(self, approval: Any) -> None:
        text = approval.prompt or "; ".join(q.get("question", "") for q in approval.questions)
        super().__init__(f"the agent asks: {text}")
        self.approval = approval


class RunFailed(PawError):
    """A run ended ``error`` or ``cancelled`` (:meth:`paw_client.Run.raise_for_status`):
    ``code`` is its first error's code (``cancelled`` for a cancel), ``run`` the run."""

    default_code = "run_failed"

    def __init__(self, run: Any) -> None:
        first = run.errors[0] if run.errors else None
        code = first.code if first else ("cancelled" if run.status == "cancelled" else "run_failed")
        message = first.message if first else f"the run ended {run.status}"
        super().__init__(message, code=code)
        self.run = run


_BY_CODE: dict[str, type[PawError]] = {
    "budget_exhausted": BudgetExhausted,
    "run_active": RunActive,
    "approval_closed": ApprovalClosed,
    "provider_inactive": ProviderInactive,
    "payload_too_large": PayloadTooLarge,
    "throttled": RateLimited,
    "locked_out": RateLimited,
    "not_found": NotFound,
}
_BY_STATUS: dict[int, type[PawError]] = {
    400: InvalidRequest,
    401: AuthenticationFailed,
    402: BudgetExhausted,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    413: PayloadTooLarge,
    429: RateLimited,
}


def error_for(status: int, body: Any, headers: Any = None) -> PawError:
    """The typed error for an HTTP answer: ``status``, its decoded JSON ``body`` (anything
    else is tolerated: a proxy's HTML page becomes the detail's first 200 characters) and
    its ``headers`` (a mapping; ``Retry-After`` is read from it)."""
    if not isinstance(body, dict):
        text = body.decode(errors="replace") if isinstance(body, bytes) else str(body or "")
        body = {"detail": text.strip()[:200] or f"HTTP {status}", "code": f"http_{status}"}
    code = str(body.get("code") or f"http_{status}")
    detail = str(body.get("detail") or f"HTTP {status}")
    cls = (
        _BY_CODE.get(code) or _BY_STATUS.get(status) or (ServerError if status >= 500 else PawError)
    )
    if issubclass(cls, RateLimited):
        retry = (headers or {}).get("Retry-After")
        try:
            retry_after = float(retry) if retry is not None else None
        except ValueError:
            retry_after = None
        return cls(detail, code=code, status=status, body=body, retry_after=retry_after)
    return cls(detail, code=code, status=status, body=body)
