"""The one renderer of API errors: every error body is ``{"detail": "...", "code": "..."}``.

Used by DRF (``REST_FRAMEWORK["EXCEPTION_HANDLER"]``) and by the JSON 404/500 handlers for
``/api/`` paths that no view matched. Validation errors also carry ``fields``: the
per-field messages, so a client can show them next to its inputs.
"""

from __future__ import annotations

import logging
from typing import Any

from django.core.exceptions import (
    PermissionDenied,
    RequestDataTooBig,
    SuspiciousOperation,
    TooManyFieldsSent,
    TooManyFilesSent,
)
from django.http import Http404, HttpRequest, JsonResponse
from django.views import csrf, defaults
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from paw_project.errors import DomainError

logger = logging.getLogger(__name__)


def _flatten(detail: Any) -> str:
    """One readable sentence from a DRF error detail (a string, list or nested dict)."""
    if isinstance(detail, dict):
        parts = []
        for field, value in detail.items():
            text = _flatten(value)
            parts.append(text if field == "non_field_errors" else f"{field}: {text}")
        return " ".join(parts)
    if isinstance(detail, list):
        return " ".join(_flatten(item) for item in detail)
    return str(detail)


def _field_messages(detail: Any, prefix: str = "") -> dict[str, list[str]]:
    """DRF's validation detail as ``{field: [message, ...]}``, flat at any depth: the errors
    of a list's items and of a nested object get dotted names (``answers.1``,
    ``options.x``, ``rows.0.name``), so every value is a list of strings, as the API's
    ``Error`` schema says; a list's plain messages stay under the list's own name."""
    if isinstance(detail, dict):
        fields: dict[str, list[str]] = {}
        for name, value in detail.items():
            fields.update(_field_messages(value, f"{prefix}.{name}" if prefix else str(name)))
        return fields
    if isinstance(detail, list) and any(isinstance(item, (dict, list)) for item in detail):
        fields = {}
        for index, item in enumerate(detail):
            if isinstance(item, (dict, list)):
                fields.update(_field_messages(item, f"{prefix}.{index}" if prefix else str(index)))
            else:
                fields.setdefault(prefix or "non_field_errors", []).append(str(item))
        return fields
    messages = detail if isinstance(detail, list) else [detail]
    return {prefix or "non_field_errors": [str(message) for message in messages]}


def _first_code(codes: Any, default: str) -> str:
    """The first machine code found in DRF's ``get_codes()`` structure."""
    if isinstance(codes, str):
        return codes
    if isinstance(codes, dict):
        for value in codes.values():
            return _first_code(value, default)
    if isinstance(codes, list) and codes:
        return _first_code(codes[0], default)
    return default


def error_body(exc: exceptions.APIException) -> dict[str, Any]:
    """``{"detail", "code"}`` (plus ``fields`` for validation errors) for a DRF exception."""
    detail = exc.detail
    if isinstance(exc, exceptions.ValidationError):
        fields = _field_messages(detail)
        code = _first_code(exc.get_codes(), "invalid")
        return {"detail": _flatten(detail) or "Invalid input.", "code": code, "fields": fields}
    if isinstance(detail, dict) and "detail" in detail:
        # simplejwt's InvalidToken: {"detail", "code", "messages"}
        return {"detail": str(detail["detail"]), "code": str(detail.get("code", exc.default_code))}
    return {"detail": _flatten(detail), "code": _first_code(exc.get_codes(), exc.default_code)}


class PayloadTooLarge(exceptions.APIException):
    """413: the body is over ``DATA_UPLOAD_MAX_MEMORY_SIZE``."""

    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


class TooManyParts(exceptions.APIException):
    """400: more form fields or files than Django accepts in one request."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "The request has too many fields or files."
    default_code = "too_many_fields"


class BadRequest(exceptions.APIException):
    """400: any other request Django finds suspicious (its reason goes to the log only)."""

    status_code = status.HTTP_400_BAD_REQUEST
    default_detail = "Bad request."
    default_code = "bad_request"


def _as_api_exception(exc: Exception) -> Exception:
    """Django's own exceptions as the DRF exceptions they mean, with PAW's generic messages:
    DRF would keep ``Http404``'s message, which names the model ("No Conversation
    matches the given query.")."""
    if isinstance(exc, Http404):
        return exceptions.NotFound()
    if isinstance(exc, PermissionDenied):
        return exceptions.PermissionDenied()
    if isinstance(exc, RequestDataTooBig):
        return PayloadTooLarge()
    if isinstance(exc, (TooManyFieldsSent, TooManyFilesSent)):
        return TooManyParts()
    if isinstance(exc, SuspiciousOperation):
        return BadRequest()
    return exc


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF exception handler: domain errors, DRF errors and unexpected errors, one shape.

    Status codes and headers (``Retry-After`` on 429, ``WWW-Authenticate`` on 401) are kept
    from DRF's own handler. Django's ``Http404``, ``PermissionDenied`` and suspicious
    requests (too large: 413 ``payload_too_large``; too many fields or files: 400) get the
    same shape. An unexpected exception is logged with its traceback and answered
    ``500 {"detail": "Internal server error.", "code": "server_error"}``.
    """
    if isinstance(exc, SuspiciousOperation):
        logger.warning("suspicious API request: %s", exc)
    exc = _as_api_exception(exc)
    if isinstance(exc, DomainError):
        response = Response(exc.as_dict(), status=exc.status_code)
        for name, value in exc.headers.items():
            response[name] = value
        return response

    response = drf_exception_handler(exc, context)
    if response is not None:
        if isinstance(exc, exceptions.APIException):
            response.data = error_body(exc)
        return response

    logger.exception("unhandled error in API view", exc_info=exc)
    return Response(
        {"detail": "Internal server error.", "code": "server_error"},
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def not_found(request: HttpRequest, exception: Exception | None = None):
    """``handler404``: JSON for ``/api/`` paths, Django's page elsewhere."""
    if _is_api(request):
        return JsonResponse({"detail": "Not found.", "code": "not_found"}, status=404)
    return defaults.page_not_found(request, exception)


def bad_request(request: HttpRequest, exception: Exception | None = None):
    """``handler400`` (a bad ``Host`` header, a malformed body): JSON for ``/api/`` paths,
    Django's page elsewhere."""
    if _is_api(request):
        return JsonResponse({"detail": "Bad request.", "code": "bad_request"}, status=400)
    return defaults.bad_request(request, exception)


def permission_denied(request: HttpRequest, exception: Exception | None = None):
    """``handler403``: JSON for ``/api/`` paths, Django's page elsewhere."""
    if _is_api(request):
        return JsonResponse(
            {"detail": "You do not have permission to perform this action.",
             "code": "permission_denied"},
            status=403,
        )  # fmt: skip
    return defaults.permission_denied(request, exception)


def csrf_failure(request: HttpRequest, reason: str = ""):
    """``CSRF_FAILURE_VIEW``: JSON for ``/api/`` paths (the same body DRF gives a failed
    CSRF check under session authentication), Django's page elsewhere."""
    if _is_api(request):
        return JsonResponse(
            {"detail": f"CSRF Failed: {reason}", "code": "permission_denied"}, status=403
        )
    return csrf.csrf_failure(request, reason)


def server_error(request: HttpRequest):
    """``handler500``: JSON for ``/api/`` paths, Django's page elsewhere."""
    if _is_api(request):
        return JsonResponse(
            {"detail": "Internal server error.", "code": "server_error"}, status=500
        )
    return defaults.server_error(request)
