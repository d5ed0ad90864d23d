"""Every API error has one shape: {"detail": "...", "code": "..."} with the right status."""

from __future__ import annotations

import pytest
from django.core.exceptions import PermissionDenied
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import Http404, HttpResponse
from django.test import Client, override_settings
from django.urls import path
from rest_framework import serializers
from rest_framework.parsers import MultiPartParser
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from paw_project.errors import BudgetExhausted, Conflict, InvalidRequest, NotFound


class EchoApi(APIView):
    permission_classes = (AllowAny,)

    class InputSerializer(serializers.Serializer):
        prompt = serializers.CharField(max_length=10)
        count = serializers.IntegerField(min_value=1)

    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(data.validated_data)


class StyleSerializer(serializers.Serializer):
    colour = serializers.ChoiceField(choices=["red", "blue"])


class NestedApi(APIView):
    permission_classes = (AllowAny,)

    class InputSerializer(serializers.Serializer):
        answers = serializers.ListField(child=serializers.CharField(max_length=3))
        options = serializers.DictField(child=serializers.IntegerField())
        style = StyleSerializer()

    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        return Response(data.validated_data)


class DomainApi(APIView):
    permission_classes = (AllowAny,)

    def get(self, request, which: str):
        if which == "missing":
            raise NotFound("No such conversation.")
        if which == "conflict":
            raise Conflict("A run is already active.", code="run_active")
        if which == "django-404":
            # What get_object_or_404() / get_object() raise: the message names the model.
            raise Http404("No Conversation matches the given query.")
        if which == "django-403":
            raise PermissionDenied("internal reason")
        if which == "extra-clash":
            raise InvalidRequest(
                "Real detail.", code="real_code", extra={"detail": "x", "code": "y"}
            )
        if which == "budget":
            raise BudgetExhausted(
                "Monthly budget used up.",
                extra={"used": 100, "limit": 100},
                headers={"X-Budget-Reset": "2026-12-01"},
            )
        raise RuntimeError("boom: an unexpected bug")


class UploadApi(APIView):
    permission_classes = (AllowAny,)
    parser_classes = (MultiPartParser,)  # multipart is accepted only where files are

    def post(self, request):
        return Response({"fields": len(request.data), "files": len(request.FILES)})


def plain_django_form(request):
    """A view outside DRF, so Django's CSRF middleware checks its POSTs."""
    return HttpResponse("ok")


class PrivateApi(APIView):
    def get(self, request):
        return Response({"ok": True})


class OneRequestThrottle(AnonRateThrottle):
    rate = "1/min"
    scope = "test-errors"


class ThrottledApi(APIView):
    permission_classes = (AllowAny,)
    throttle_classes = (OneRequestThrottle,)

    def get(self, request):
        return Response({"ok": True})


urlpatterns = [
    path("api/echo", EchoApi.as_view()),
    path("api/domain/<str:which>", DomainApi.as_view()),
    path("api/private", PrivateApi.as_view()),
    path("api/throttled", ThrottledApi.as_view()),
    path("api/nested", NestedApi.as_view()),
    path("api/upload", UploadApi.as_view()),
    path("api/plain-form", plain_django_form),
]

pytestmark = [pytest.mark.urls(__name__)]


def test_validation_error_names_fields_in_one_sentence(client):
    response = client.post("/api/echo", {"prompt": "x" * 11}, content_type="application/json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] in {"max_length", "required"}
    assert "prompt:" in body["detail"] and "count:" in body["detail"]
    assert set(body["fields"]) == {"prompt", "count"}


def test_the_errors_of_list_items_and_nested_objects_are_lists_of_strings_with_dotted_names(
    client,
):
    """DRF reports a list's item errors as ``{"1": [...]}`` and a nested object's as a dict;
    ``fields`` gives every one a dotted name and a list of strings (the Error schema)."""
    body = {"answers": ["ok", "", "toolong"], "options": {"a": "x"}, "style": {"colour": "green"}}
    response = client.post("/api/nested", body, content_type="application/json")
    assert response.status_code == 400
    fields = response.json()["fields"]
    assert set(fields) == {"answers.1", "answers.2", "options.a", "style.colour"}
    assert all(
        isinstance(messages, list) and messages and all(isinstance(m, str) for m in messages)
        for messages in fields.values()
    ), fields
    assert "answers:" in response.json()["detail"]


def test_malformed_json_is_a_400_parse_error(client):
    response = client.post("/api/echo", "{not json", content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] == "parse_error"
    assert response.json()["detail"]


@pytest.mark.parametrize(
    ("which", "status", "code"),
    [
        ("missing", 404, "not_found"),
        ("conflict", 409, "run_active"),
        ("budget", 402, "budget_exhausted"),
    ],
)
def test_domain_errors_render_with_their_status_and_code(client, which, status, code):
    response = client.get(f"/api/domain/{which}")
    assert response.status_code == status
    assert response.json()["code"] == code
    assert response.json()["detail"]


def test_domain_error_extra_fields_and_headers_are_kept(client):
    response = client.get("/api/domain/budget")
    assert response.json() == {
        "detail": "Monthly budget used up.",
        "code": "budget_exhausted",
        "used": 100,
        "limit": 100,
    }
    assert response["X-Budget-Reset"] == "2026-12-01"


def test_unexpected_error_is_a_json_500_without_internals(client):
    client.raise_request_exception = False
    response = client.get("/api/domain/bug")
    assert response.status_code == 500
    assert response.json() == {"detail": "Internal server error.", "code": "server_error"}


def test_unauthenticated_is_401_with_the_shape(client):
    response = client.get("/api/private")
    assert response.status_code == 401
    assert response.json()["code"] == "not_authenticated"
    assert "WWW-Authenticate" in response


def test_wrong_method_is_405_with_the_shape(client):
    response = client.delete("/api/echo")
    assert response.status_code == 405
    assert response.json()["code"] == "method_not_allowed"


@override_settings(ROOT_URLCONF="paw_project.urls")
def test_unknown_api_path_is_a_json_404(client):
    response = client.get("/api/no/such/thing")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found.", "code": "not_found"}


def test_throttled_is_429_with_retry_after(client):
    from django.core.cache import cache

    throttle = OneRequestThrottle()
    cache.delete(throttle.cache_format % {"scope": throttle.scope, "ident": "127.0.0.1"})
    assert client.get("/api/throttled").status_code == 200
    response = client.get("/api/throttled")
    assert response.status_code == 429
    assert response.json()["code"] == "throttled"
    assert int(response["Retry-After"]) > 0


@pytest.mark.parametrize(
    ("which", "status", "body"),
    [
        ("django-404", 404, {"detail": "Not found.", "code": "not_found"}),
        (
            "django-403",
            403,
            {
                "detail": "You do not have permission to perform this action.",
                "code": "permission_denied",
            },
        ),
    ],
)
def test_djangos_own_404_and_403_in_an_api_view_have_the_shape_and_name_no_model(
    client, which, status, body
):
    response = client.get(f"/api/domain/{which}")
    assert response.status_code == status
    assert response.json() == body


def test_domain_error_extra_cannot_replace_detail_or_code(client):
    response = client.get("/api/domain/extra-clash")
    assert response.json() == {"detail": "Real detail.", "code": "real_code"}


@override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=100)
def test_a_too_large_body_is_413_payload_too_large(client):
    response = client.post("/api/upload", {"text": "x" * 500})  # multipart
    assert response.status_code == 413
    assert response.json() == {
        "detail": "The request body is too large.",
        "code": "payload_too_large",
    }


@override_settings(DATA_UPLOAD_MAX_NUMBER_FIELDS=5)
def test_too_many_fields_is_a_400(client):
    response = client.post("/api/upload", {f"f{i}": "x" for i in range(20)})
    assert response.status_code == 400
    assert response.json()["code"] == "too_many_fields"


@override_settings(DATA_UPLOAD_MAX_NUMBER_FILES=2)
def test_too_many_files_is_a_400(client):
    files = {f"file{i}": SimpleUploadedFile(f"f{i}.txt", b"x") for i in range(5)}
    response = client.post("/api/upload", files)
    assert response.status_code == 400
    assert response.json()["code"] == "too_many_fields"


def test_json_nested_too_deeply_is_a_400_parse_error(client):
    body = "[" * 100_000 + "]" * 100_000
    response = client.post("/api/echo", body, content_type="application/json")
    assert response.status_code == 400
    assert response.json()["code"] == "parse_error"


@override_settings(ROOT_URLCONF="paw_project.urls")
@pytest.mark.parametrize("method", ["post", "put", "patch", "delete"])
def test_unknown_api_path_is_a_json_404_for_every_method_even_without_csrf_token(method):
    response = getattr(Client(enforce_csrf_checks=True), method)("/api/no/such/thing")
    assert response.status_code == 404
    assert response.json() == {"detail": "Not found.", "code": "not_found"}


def test_a_failed_csrf_check_under_api_answers_json():
    response = Client(enforce_csrf_checks=True).post("/api/plain-form", {"a": "b"})
    assert response.status_code == 403
    body = response.json()
    assert body["code"] == "permission_denied"
    assert body["detail"].startswith("CSRF Failed:")


@override_settings(ROOT_URLCONF="paw_project.urls")
def test_a_bad_host_under_api_is_a_json_400(client):
    response = client.get("/api/conversations", HTTP_HOST="evil.example")
    assert response.status_code == 400
    assert response.json() == {"detail": "Bad request.", "code": "bad_request"}
