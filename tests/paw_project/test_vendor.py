"""plotly.js and its stylesheet, served by PAW from the installed plotly package (no CDN)."""

from __future__ import annotations

from importlib import metadata, resources
from pathlib import Path

import pytest

pytestmark = pytest.mark.django_db


def plotly_min_js() -> bytes:
    return Path(str(resources.files("plotly") / "package_data" / "plotly.min.js")).read_bytes()


def test_plotly_js_is_the_packages_own_file_cached_by_version(client):
    response = client.get("/vendor/plotly.min.js?v=x")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/javascript; charset=utf-8"
    assert b"".join(response.streaming_content) == plotly_min_js()
    assert "immutable" in response["Cache-Control"]
    etag = response["ETag"]
    assert metadata.version("plotly") in etag
    again = client.get("/vendor/plotly.min.js", headers={"If-None-Match": etag})
    assert again.status_code == 304
    assert client.post("/vendor/plotly.min.js").status_code == 405


def test_plotly_css_holds_the_rules_plotly_js_would_inject(client):
    response = client.get("/vendor/plotly.css")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/css; charset=utf-8"
    css = response.content.decode()
    # plotly.js's own table, expanded as plotly.js does (X → .js-plotly-plot .plotly) …
    assert ".js-plotly-plot .plotly .modebar{position:absolute;top:2px;right:2px;}" in css
    assert ".plotly-notifier p{margin:0;}" in css
    # … and the bundled map library's sheet it injects unless its id is on the page.
    assert ".maplibregl-map{" in css


def test_the_chat_page_links_them_under_the_ids_plotly_js_looks_for(client, user):
    from paw_project.vendor import plotly_style_ids

    client.force_login(user)
    page = client.get("/").content.decode()
    assert 'id="plotly.js-style-global" class="no-inline-styles"' in page
    ids = plotly_style_ids()
    assert ids and all(f'id="{ident}"' in page for ident in ids)
    assert f"/vendor/plotly.min.js?v={metadata.version('plotly')}" in page
