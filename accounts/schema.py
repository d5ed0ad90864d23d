"""OpenAPI description of PAW's JWT authentication (drf-spectacular extension)."""

from __future__ import annotations

from drf_spectacular.contrib.rest_framework_simplejwt import SimpleJWTScheme


class PawJWTScheme(SimpleJWTScheme):
    """Documents ``PawJWTAuthentication`` as simplejwt's bearer scheme (``jwtAuth``)."""

    target_class = "accounts.authentication.PawJWTAuthentication"
