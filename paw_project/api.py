"""Building blocks shared by every app's REST API: pagination, strict input serializers and
the documented error shape.

- :class:`PawPagination`: ``?page=<n>&page_size=<n>`` → ``{count, next, previous, results}``.
- :class:`StrictSerializer`: an input serializer that answers 400 ``unknown_field`` for keys
  it does not declare, so a typo (``titel``) is an error instead of a silent no-op.
- :func:`error_responses`: the OpenAPI responses for the error statuses an operation can
  answer, all with the one error body ``{"detail", "code"}`` (``ErrorSerializer``).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.drainage import set_override
from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.pagination import CursorPagination, PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView


class PawPagination(PageNumberPagination):
    """Page-number pagination: ``page`` (1-based) and ``page_size`` (1 to 100, default 20).

    A page past the end answers 404 ``not_found``; a ``page_size`` that is not a positive
    integer falls back to the default (DRF's behaviour).
    """

    page_size = 20
    page_size_query_param = "page_size"
    max_page_size = 100


class PawCursorPagination(CursorPagination):
    """Cursor pagination for lists that change while being read (newest first):
    ``?cursor=<opaque>&page_size=<1 to 100>`` (default 20) → ``{next, previous, results}``.

    Pages stay consistent while items are added, and no ``COUNT`` query is needed (the
    conversation list is the API's hottest read). Subclass it with an ``ordering`` whose
    first field is the position (ties are handled by DRF with an offset). An invalid
    cursor answers 404 ``not_found``.
    """

    page_size = 20
    page_size_query_param = "page_size"
    max_page_size = 100


class JsonTypedSerializer(serializers.Serializer):
    """An input serializer that takes each value of a JSON body only in its field's JSON
    type (400, code ``invalid``, see :func:`json_type_errors`) instead of DRF's coercion
    ("yes" → True, "60" → 60, 123 → "123"). Form bodies (a ``QueryDict``, strings only)
    are coerced as DRF does."""

    def to_internal_value(self, data: Any) -> Any:
        if type(data) is dict:  # a JSON body (a form's QueryDict holds only strings)
            wrong = json_type_errors(self.fields, data)
            if wrong:
                raise serializers.ValidationError(wrong, code="invalid")
        return super().to_internal_value(data)


class StrictSerializer(JsonTypedSerializer):
    """A serializer that rejects keys it does not declare (400, code ``unknown_field``) and
    values not of their field's JSON type (:class:`JsonTypedSerializer`).

    Nested in a view (``RegisterApi.InputSerializer``), its OpenAPI component is named after
    the view (``RegisterApiInput``), so the many ``InputSerializer`` classes do not clash.
    """

    default_error_messages = {"unknown_field": "Unknown field."}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        outer, _, inner = cls.__qualname__.rpartition(".")
        if outer and "<" not in outer:
            name = outer.rsplit(".", 1)[-1] + inner.removesuffix("Serializer")
            set_override(cls, "component_name", name)

    def to_internal_value(self, data: Any) -> Any:
        if hasattr(data, "keys"):
            unknown = sorted(set(data.keys()) - set(self.fields))
            if unknown:
                raise serializers.ValidationError(
                    {name: [self.error_messages["unknown_field"]] for name in unknown},
                    code="unknown_field",
                )
        return super().to_internal_value(data)


# The JSON type each kind of field takes, most specific first: DRF would otherwise coerce
# ("yes" → True, "60" → 60, 123 → "123"), so a client's mistake would pass as a choice.
_JSON_TYPES: tuple[tuple[type[serializers.Field], tuple[type, ...], str], ...] = (
    (serializers.BooleanField, (bool,), "a JSON boolean (true or false)"),
    (serializers.IntegerField, (int,), "a JSON integer"),
    (serializers.FloatField, (int, float), "a JSON number"),
    (serializers.CharField, (str,), "a JSON string"),
)


def json_type_errors(fields: Any, data: dict[str, Any]) -> dict[str, list[str]]:
    """Messages for the values of ``data`` (a parsed JSON object) whose JSON type is not
    the one their field takes: booleans for ``BooleanField``, integers (not booleans) for
    ``IntegerField``, numbers for ``FloatField``, strings for ``CharField`` and its
    subclasses, and the same for each item of a ``ListField`` of those; ``null`` is left
    to the field (``allow_null``). Returns ``{name:
    [message]}``, empty when every value has its type."""
    errors: dict[str, list[str]] = {}
    for name, value in data.items():
        field = fields.get(name)
        if field is None or value is None or field.read_only:
            continue
        if isinstance(field, serializers.ListField) and isinstance(value, list):
            wanted = next(
                (_json_type_error(field.child, item) for item in value if item is not None), None
            )
            if wanted:
                errors[name] = [f"Each item must be {wanted}."]
            continue
        wanted = _json_type_error(field, value)
        if wanted:
            errors[name] = [f"Must be {wanted}."]
    return errors


def _json_type_error(field: Any, value: Any) -> str | None:
    """The JSON type ``field`` takes when ``value`` is not of it (e.g. "a JSON string"),
    else ``None``."""
    for kind, types, wanted in _JSON_TYPES:
        if isinstance(field, kind):
            if not isinstance(value, types) or (bool not in types and isinstance(value, bool)):
                return wanted
            return None
    return None


class ErrorSerializer(serializers.Serializer):
    """Every API error body (``paw_project.exception_handlers``)."""

    detail = serializers.CharField(help_text="A human sentence saying what went wrong.")
    code = serializers.CharField(help_text="A machine code, e.g. `not_found`, `throttled`.")


class ValidationErrorSerializer(ErrorSerializer):
    """A 400 body: the error shape plus the messages per field."""

    fields = serializers.DictField(
        child=serializers.ListField(child=serializers.CharField()),
        required=False,
        help_text="Messages per input field.",
    )


class BudgetExhaustedSerializer(ErrorSerializer):
    """A 402 body (``budget_exhausted``): the error shape plus where the budget stands."""

    used = serializers.IntegerField(help_text="Tokens used this month (UTC).")
    limit = serializers.IntegerField(help_text="The monthly token budget.")
    resets_at = serializers.DateTimeField(help_text="When the budget resets (UTC).")


_DESCRIPTIONS = {
    400: "Invalid input (wrong type, unknown field, bad parameter).",
    401: "Not authenticated, or the token is invalid, expired or revoked.",
    402: "The monthly token budget is used up (`budget_exhausted`).",
    403: "Not allowed (for a session: missing CSRF token).",
    404: "No such object for this user.",
    409: "Conflicts with the current state.",
    413: "The payload is too large.",
    429: "Throttled; retry after `Retry-After` seconds.",
}


_BODIES = {400: ValidationErrorSerializer, 402: BudgetExhaustedSerializer}


def list_output(
    *, key: str, item: type[serializers.Serializer], ref_name: str
) -> type[serializers.Serializer]:
    """The output serializer of an unpaginated list answered as ``{key: [item, ...]}``,
    named ``ref_name`` in the OpenAPI schema (e.g. ``GET /api/providers`` →
    ``{"providers": [...]}``)."""
    meta = type("Meta", (), {"ref_name": ref_name})
    return type(ref_name, (serializers.Serializer,), {key: item(many=True), "Meta": meta})


def error_responses(*statuses: int) -> dict[int, OpenApiResponse]:
    """OpenAPI responses for ``statuses`` (plus 401, which every authenticated operation can
    answer), each with the error body. For ``extend_schema(responses={...})``."""
    wanted = sorted(set(statuses) | {401})
    return {
        status: OpenApiResponse(
            response=_BODIES.get(status, ErrorSerializer),
            description=_DESCRIPTIONS.get(status, "Error."),
        )
        for status in wanted
    }


def paginated_response(
    *,
    request: Request,
    view: APIView,
    queryset: Any,
    serializer_class: type[serializers.BaseSerializer],
    context: dict[str, Any] | None = None,
    pagination_class: type[PageNumberPagination | CursorPagination] = PawPagination,
) -> Response:
    """One page of ``queryset`` serialized with ``serializer_class``, by
    ``pagination_class``: :class:`PawPagination` (``{"count", "next", "previous",
    "results"}``) or a :class:`PawCursorPagination` (no ``count``). Raises DRF's
    ``NotFound`` (404) for a page past the end or a malformed page or cursor."""
    paginator = pagination_class()
    page = paginator.paginate_queryset(queryset, request, view=view)
    data = serializer_class(page, many=True, context=context or {}).data
    return paginator.get_paginated_response(data)
