"""Websocket routes (served by Daphne through ``paw_project.asgi``)."""

from __future__ import annotations

websocket_urlpatterns: list = []
