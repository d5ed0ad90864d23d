"""The OpenAPI schema documents the API, and a bounded schemathesis run against it (as a
signed-in user, on real objects of theirs) finds no 500 and no undocumented answer."""

from __future__ import annotations

import zlib

import pytest
import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from conversations.models import ConversationFile
from conversations.services.workspaces import workspace_ensure
from tests.conftest import api_client_for
from tests.factories import conversation_of

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("reset_throttles")]


@pytest.fixture
def wsgi_app():
    """Django's WSGI application, with the per-request connection closing switched off as
    Django's test client does, so requests stay inside the test's transaction."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield get_wsgi_application()
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


@pytest.fixture
def paw_schema(wsgi_app):
    return schemathesis.openapi.from_wsgi("/api/schema/", wsgi_app)


schema = schemathesis.pytest.from_fixture("paw_schema")


def test_schema_documents_the_error_shape_and_bearer_auth():
    response = api_client_for().get("/api/schema/", HTTP_ACCEPT="application/json")
    assert response.status_code == 200
    document = response.json()
    components = document["components"]
    assert set(components["schemas"]["Error"]["required"]) == {"detail", "code"}
    assert components["securitySchemes"]["jwtAuth"]["scheme"] == "bearer"
    get_conversation = document["paths"]["/api/conversations/{conversation_id}"]["get"]
    assert get_conversation["responses"]["404"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/Error"
    }
    upload = document["paths"]["/api/conversations/{conversation_id}/files"]["post"]
    assert "multipart/form-data" in upload["requestBody"]["content"]
    assert "413" in upload["responses"] and "429" in upload["responses"]
    # Any bearer token can be refused for its address's failed ones (PAW_THROTTLE_BAD_TOKENS).
    assert "429" in document["paths"]["/api/auth/me"]["get"]["responses"]


# Every operation of the API in one test (about 100 × 40 requests: 2 minutes on the CI
# machine, over 5 under other load): the session's 300 s bound is for one test's work.
@pytest.mark.timeout(1200)
@schema.parametrize()
@settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(HealthCheck),
)
def test_api_answers_every_generated_request_as_documented(case, user):
    conversation = conversation_of(user, title="fuzzed")
    folder = workspace_ensure(conversation.id)
    (folder / "chart.png").write_bytes(b"\x89PNG fake")
    (folder / "data.csv").write_text("a\n1\n")
    upload = ConversationFile.objects.create(
        conversation=conversation, name="data.csv", size=4, sha256="0"
    )
    # Half the generated ids are kept (404 paths), half point at the user's real objects.
    params = case.path_parameters or {}
    if "conversation_id" in params and zlib.crc32(str(params["conversation_id"]).encode()) % 2:
        params["conversation_id"] = str(conversation.id)
        if "file_id" in params:
            params["file_id"] = str(upload.id)
        if "path" in params and zlib.crc32(str(params["path"]).encode()) % 3 == 0:
            params["path"] = "chart.png"
    token = api_client_for(user)._credentials["HTTP_AUTHORIZATION"]
    response = case.call(headers={"Authorization": token})
    case.validate_response(
        response,
        checks=[
            not_a_server_error,
            status_code_conformance,
            content_type_conformance,
            response_schema_conformance,
        ],
    )
