"""Third-party browser code PAW serves itself (no CDN: the pages' Content-Security-Policy
allows scripts from PAW only).

``GET /vendor/plotly.min.js``: plotly.js as the installed ``plotly`` Python package ships
it (``plotly/package_data/plotly.min.js``), for the chat page's interactive charts. The
page asks for ``?v=<plotly version>`` (:func:`plotly_js_url`), so the file can be cached
for a year and a new package version is a new address.

``GET /vendor/plotly.css``: plotly.js's own style rules as a stylesheet. plotly.js adds
them at run time through an inline ``<style>`` element, which the pages' policy
(``style-src 'self'``) refuses; it skips that when the page has an element
``id="plotly.js-style-global"`` with class ``no-inline-styles`` (its strict-CSP mode), so
the chat page links this file under that id. The rules are read from the same
``plotly.min.js`` (its ``{"X,X div": …}`` table, ``X`` standing for
``.js-plotly-plot .plotly`` and ``Y`` for ``.plotly-notifier``, as plotly.js expands them),
with the stylesheet of the map library bundled in it, which plotly.js injects at load
(``<style id=…>``) unless the page has an element of that id: the page links this file
under those ids too (:func:`plotly_style_ids`).
"""

from __future__ import annotations

import re
from functools import cache
from importlib import metadata, resources
from pathlib import Path

from django.core.handlers.asgi import ASGIRequest
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    HttpResponseNotModified,
    StreamingHttpResponse,
)
from django.views.decorators.http import require_safe

from paw_project.streaming import file_chunks


@cache
def plotly_js_path() -> Path | None:
    """The ``plotly.min.js`` of the installed ``plotly`` package, or None without it."""
    try:
        path = Path(str(resources.files("plotly") / "package_data" / "plotly.min.js"))
    except ModuleNotFoundError:
        return None
    return path if path.is_file() else None


@cache
def plotly_version() -> str:
    """The installed ``plotly`` package's version ("" without it)."""
    try:
        return metadata.version("plotly")
    except metadata.PackageNotFoundError:
        return ""


def plotly_js_url() -> str:
    """Where the chat page loads plotly.js from ("" when the package is missing: the page
    then shows the charts' PNG fallback)."""
    if plotly_js_path() is None:
        return ""
    return f"/vendor/plotly.min.js?v={plotly_version()}"


def plotly_css_url() -> str:
    """Where the chat page loads plotly.js's stylesheet from ("" without plotly)."""
    if plotly_js_path() is None:
        return ""
    return f"/vendor/plotly.css?v={plotly_version()}"


_STRING = r"""(?:"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')"""
_RULE = re.compile(rf"({_STRING})\s*:\s*({_STRING})")


def _unquote(literal: str) -> str:
    body = literal[1:-1]
    return re.sub(r"\\(.)", r"\1", body)


@cache
def plotly_css() -> str:
    """plotly.js's style rules (see the module's docstring) as CSS text; "" when they
    cannot be found in the installed ``plotly.min.js``."""
    path = plotly_js_path()
    if path is None:
        return ""
    source = path.read_text(encoding="utf-8")
    start = source.find('{"X,X div"')
    end = source.find("};", start)
    if start < 0 or end < 0:
        return ""
    lines = [f"/* plotly.js's style rules, from the plotly {plotly_version()} package */"]
    for selector, rule in _RULE.findall(source[start : end + 1]):
        full = _unquote(selector)
        full = re.sub(r"^,", " ,", full).replace("X", ".js-plotly-plot .plotly")
        full = full.replace("Y", ".plotly-notifier")
        lines.append(f"{full}{{{_unquote(rule)}}}")
    for _, css in _bundled_styles(source):
        lines.append(css)
    return "\n".join(lines) + "\n"


_BUNDLED_STYLE = re.compile(
    r'document\.getElementById\("([0-9a-f]{16,})"\)\)\{var (\w+)=document\.createElement\('
    r'"style"\);\2\.id="\1",\2\.textContent=(' + _STRING + ")"
)


def _bundled_styles(source: str) -> list[tuple[str, str]]:
    """The stylesheets of libraries bundled in plotly.js (maplibre's) that it injects at
    load as ``<style id=ID>`` unless an element ``ID`` exists: ``[(ID, css)]``."""
    return [(match[0], _unquote(match[2])) for match in _BUNDLED_STYLE.findall(source)]


@cache
def plotly_style_ids() -> list[str]:
    """The element ids plotly.js looks for before it injects a bundled library's styles:
    the chat page links :func:`plotly_css_url` (which holds those styles too) under each,
    so nothing is injected."""
    path = plotly_js_path()
    if path is None:
        return []
    return [ident for ident, _ in _bundled_styles(path.read_text(encoding="utf-8"))]


@require_safe
def plotly_stylesheet(request: HttpRequest) -> HttpResponse:
    """plotly.js's stylesheet (``text/css``), cached for a year; 404 without plotly."""
    css = plotly_css()
    if not css:
        raise Http404("plotly is not installed")
    response = HttpResponse(css, content_type="text/css; charset=utf-8")
    response["Cache-Control"] = "public, max-age=31536000, immutable"
    response["X-Content-Type-Options"] = "nosniff"
    return response


@require_safe
def plotly_js(
    request: HttpRequest,
) -> FileResponse | StreamingHttpResponse | HttpResponseNotModified:
    """plotly.js (``text/javascript``), cached for a year; 404 when plotly is not installed."""
    path = plotly_js_path()
    if path is None:
        raise Http404("plotly is not installed")
    etag = f'"plotly-{plotly_version()}"'
    if request.headers.get("If-None-Match") == etag:
        return HttpResponseNotModified(headers={"ETag": etag})
    file = path.open("rb")
    content_type = "text/javascript; charset=utf-8"
    if isinstance(request, ASGIRequest):
        response = StreamingHttpResponse(file_chunks(file), content_type=content_type)
        response._resource_closers.append(file.close)
        response["Content-Length"] = str(path.stat().st_size)
    else:
        response = FileResponse(file, content_type=content_type)
    response["ETag"] = etag
    response["Cache-Control"] = "public, max-age=31536000, immutable"
    response["X-Content-Type-Options"] = "nosniff"
    return response
