"""Websocket routes (served through ``paw_project.asgi``)."""

from __future__ import annotations

from django.urls import re_path

from conversations.consumers import ConversationConsumer, UserConsumer

websocket_urlpatterns = [
    re_path(r"^ws/conversations/(?P<conversation_id>[^/]+)/$", ConversationConsumer.as_asgi()),
    re_path(r"^ws/user/$", UserConsumer.as_asgi()),
]
