"""A URL configuration of views that leak secret values on purpose, for the tests that
prove the secret scan catches them (``settings.ROOT_URLCONF = LEAKY_URLCONF``).

``/leak/<form>/<NAME>/`` answers the stored value of the global secret ``NAME`` in one
of several forms (JSON, HTML, a header, a streamed body split mid-value, a file);
``/echo/?text=...`` answers ``text`` as it came (no database: usable from async tests);
``/masked/<NAME>/`` answers what PAW should: ``[secret:NAME]``.
"""

from __future__ import annotations

import io

from django.http import (
    FileResponse,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.urls import path
from django.utils.html import escape

from secrets_vault.models import Secret

LEAKY_URLCONF = __name__


def _value(name: str) -> str:
    return Secret.objects.get(scope=Secret.Scope.GLOBAL, name=name).value


def leak(request: HttpRequest, form: str, name: str) -> HttpResponse:
    """The stored value of ``name``, as ``form`` asks."""
    value = _value(name)
    if form == "json":
        return JsonResponse({"name": name, "value": value})
    if form == "html":
        return HttpResponse(f"<p>Your key: {escape(value)}</p>")
    if form == "header":
        response = HttpResponse("nothing in the body")
        response["X-Debug-Key"] = value
        return response
    if form == "stream":
        half = len(value) // 2
        return StreamingHttpResponse(iter([b"key=", value[:half].encode(), value[half:].encode()]))
    if form == "file":
        return FileResponse(io.BytesIO(f"a,b\n1,{value}\n".encode()), filename="dump.csv")
    return HttpResponse(status=404)


def echo(request: HttpRequest) -> HttpResponse:
    return HttpResponse(request.GET.get("text", ""))


def masked(request: HttpRequest, name: str) -> HttpResponse:
    return JsonResponse({"value": f"[secret:{name}]"})


urlpatterns = [
    path("leak/<str:form>/<str:name>/", leak),
    path("echo/", echo),
    path("masked/<str:name>/", masked),
]
