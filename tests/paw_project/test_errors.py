"""Every API error has one shape: {"detail": "...", "code": "..."} with the right status."""

from __future__ import annotations

import pytest
from django.test import override_settings
from django.urls import path
from rest_framework import serializers
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.throttling import AnonRateThrottle
from rest_framework.views import APIView

from paw_project.errors import BudgetExhausted, Conflict, NotFound


class EchoApi(APIView):
    permission_classes = (AllowAny,)

    class InputSerializer(serializers.Serializer):
        prompt = serializers.CharField(max_length=10)
        count = serializers.IntegerField(min_value=1)

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
        if which == "budget":
            raise BudgetExhausted(
                "Monthly budget used up.",
                extra={"used": 100, "limit": 100},
                headers={"X-Budget-Reset": "2026-12-01"},
            )
        raise RuntimeError("boom: an unexpected bug")


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
]

pytestmark = [pytest.mark.urls(__name__)]


def test_validation_error_names_fields_in_one_sentence(client):
    response = client.post("/api/echo", {"prompt": "x" * 11}, content_type="application/json")
    assert response.status_code == 400
    body = response.json()
    assert body["code"] in {"max_length", "required"}
    assert "prompt:" in body["detail"] and "count:" in body["detail"]
    assert set(body["fields"]) == {"prompt", "count"}


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
