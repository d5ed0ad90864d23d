"""Page views of the web chat (edges: parse, check permission, call a selector, render)."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render


def home(request: HttpRequest) -> HttpResponse:
    """The landing page."""
    return render(request, "home.html")
