"""OpenAPI description of PAW's authentication: JWT and personal API tokens (drf-spectacular
extensions)."""

from __future__ import annotations

from drf_spectacular.contrib.rest_framework_simplejwt import SimpleJWTScheme
from drf_spectacular.extensions import OpenApiAuthenticationExtension


class PawJWTScheme(SimpleJWTScheme):
    """Documents ``PawJWTAuthentication`` as simplejwt's bearer scheme (``jwtAuth``)."""

    target_class = "accounts.authentication.PawJWTAuthentication"


class PersonalTokenScheme(OpenApiAuthenticationExtension):
    """Documents ``PersonalTokenAuthentication``: ``Authorization: Bearer paw_…``."""

    target_class = "accounts.authentication.PersonalTokenAuthentication"
    name = "personalToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A personal API token (`paw_…`, from POST /api/auth/tokens).",
        }
