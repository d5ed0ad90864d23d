"""The OpenAPI schema generator (drf-spectacular), kept apart from ``paw_project.api``:
that module is DRF's default pagination class and loads while DRF itself is loading."""

from __future__ import annotations

from typing import Any

from drf_spectacular.openapi import AutoSchema
from rest_framework.permissions import AllowAny

from paw_project.api import error_responses


class PawAutoSchema(AutoSchema):
    """drf-spectacular's schema generator, documenting the errors every operation can
    answer in the one error shape, so no answer is undocumented: 401 (no, invalid or
    revoked credentials; any request can carry a bad token), 403 unless the view allows
    anyone, 404 for paths naming an object, 400 for operations taking input, 429 for
    throttled views and for every view that takes bearer tokens (an authentication class
    with ``bearer_failures_counted``: past ``PAW_THROTTLE_BAD_TOKENS`` failed ones from an
    address, its tokens get 429). Statuses an operation documents itself are kept."""

    def _error_statuses(self) -> list[int]:
        statuses = [401]
        permissions = self.view.get_permissions() if hasattr(self.view, "get_permissions") else []
        if not all(isinstance(p, AllowAny) for p in permissions):
            statuses.append(403)
        if "{" in self.path:
            statuses.append(404)
        if (
            self.method in ("POST", "PUT", "PATCH")
            or self._get_filter_parameters()
            or self.get_override_parameters()
        ):
            statuses.append(400)
        authenticators = getattr(self.view, "authentication_classes", ())
        if getattr(self.view, "throttle_classes", None) or any(
            getattr(authenticator, "bearer_failures_counted", False)
            for authenticator in authenticators
        ):
            statuses.append(429)
        return statuses

    def _get_response_bodies(self, direction: str = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        for status, response in error_responses(*self._error_statuses()).items():
            if str(status) not in responses:
                responses[str(status)] = self._get_response_for_code(
                    response, str(status), direction=direction
                )
        return responses
