"""URL routes. Each app adds its own under ``/api/`` and the page routes; see docs/api.md."""

from __future__ import annotations

from django.contrib import admin
from django.templatetags.static import static
from django.urls import include, path, re_path
from django.views.decorators.csrf import csrf_exempt
from django.views.generic import RedirectView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from accounts.views import admin_login
from paw_project import health, metrics_http, vendor
from paw_project.exception_handlers import not_found

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    # Browsers ask for /favicon.ico on every page (the admin's and Swagger's too).
    path("favicon.ico", RedirectView.as_view(url=static("paw/favicon.svg"), permanent=True)),
    path("readyz", health.readyz, name="readyz"),
    path("metrics", metrics_http.metrics, name="metrics"),
    path("vendor/plotly.min.js", vendor.plotly_js, name="vendor-plotly"),
    path("vendor/plotly.css", vendor.plotly_stylesheet, name="vendor-plotly-css"),
    # Before the admin's own: with single sign-on, the admin signs in on PAW's page.
    path("admin/login/", admin_login, name="paw_admin_login"),
    path("admin/", admin.site.urls),
    path("accounts/", include("accounts.urls")),
    path("accounts/sso/", include("sso.urls")),
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"),
    path("api/auth/", include("accounts.api.urls")),
    path("api/", include("conversations.api.urls")),
    path("api/", include("secrets_vault.api.urls")),
    path("api/", include("billing.api.urls")),
    path("api/", include("teams.api.urls")),
    path("api/", include("audit.api.urls")),
    path("", include("conversations.urls")),
    path("", include("billing.urls")),
    path("", include("secrets_vault.urls")),
    # Unknown API paths answer JSON, in DEBUG too, for every method (CSRF-exempt: it
    # changes nothing, and a CSRF refusal would answer an HTML page instead).
    re_path(r"^api/", csrf_exempt(not_found)),
]

handler400 = "paw_project.exception_handlers.bad_request"
handler403 = "paw_project.exception_handlers.permission_denied"
handler404 = "paw_project.exception_handlers.not_found"
handler500 = "paw_project.exception_handlers.server_error"
