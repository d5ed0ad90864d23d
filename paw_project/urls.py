"""URL routes. Each app adds its own under ``/api/`` and the page routes; see the README."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, re_path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from paw_project import health
from paw_project.exception_handlers import not_found

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("admin/", admin.site.urls),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/auth/", include("accounts.api.urls")),
    path("api/", include("conversations.api.urls")),
    path("", include("conversations.urls")),
    # Unknown API paths answer JSON, in DEBUG too.
    re_path(r"^api/", not_found),
]

handler404 = "paw_project.exception_handlers.not_found"
handler500 = "paw_project.exception_handlers.server_error"
