"""The one renderer of API errors: every error body is ``{"detail": "...", "code": "..."}``.

Used by DRF (``REST_FRAMEWORK["EXCEPTION_HANDLER"]``) and by the JSON 404/500 handlers for
``/api/`` paths that no view matched. Validation errors also carry ``fields``: the
per-field messages, so a client can show them next to its inputs.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.http import HttpRequest, JsonResponse
from django.views import defaults
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
        fields = detail if isinstance(detail, dict) else {"non_field_errors": detail}
        code = _first_code(exc.get_codes(), "invalid")
        return {"detail": _flatten(detail) or "Invalid input.", "code": code, "fields": fields}
    if isinstance(detail, dict) and "detail" in detail:
        # simplejwt's InvalidToken: {"detail", "code", "messages"}
        return {"detail": str(detail["detail"]), "code": str(detail.get("code", exc.default_code))}
    return {"detail": _flatten(detail), "code": _first_code(exc.get_codes(), exc.default_code)}


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    """DRF exception handler: domain errors, DRF errors and unexpected errors, one shape.

    Status codes and headers (``Retry-After`` on 429, ``WWW-Authenticate`` on 401) are kept
    from DRF's own handler. An unexpected exception is logged with its traceback and
    answered ``500 {"detail": "Internal server error.", "code": "server_error"}``.
    """
    if isinstance(exc, DomainError):
        response = Response(exc.as_dict(), status=exc.status_code)
        for name, value in exc.headers.items():
            response[name] = value
        return response

    if isinstance(exc, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return Response(
            {"detail": f"The request body is larger than {limit} bytes.", "code": "body_too_large"},
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, SuspiciousOperation):
        # E.g. too many fields in a form body: the client's fault, a 400 and not a 500.
        return Response(
            {"detail": str(exc) or "Bad request.", "code": "bad_request"},
            status=status.HTTP_400_BAD_REQUEST,
        )

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


def server_error(request: HttpRequest):
    """``handler500``: JSON for ``/api/`` paths, Django's page elsewhere."""
    if _is_api(request):
        return JsonResponse(
            {"detail": "Internal server error.", "code": "server_error"}, status=500
        )
    return defaults.server_error(request)
