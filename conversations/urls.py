"""Page routes of the web chat."""

from __future__ import annotations

from django.urls import path

from conversations import views

urlpatterns = [
    path("", views.chat, name="home"),
    path("c/<uuid:conversation_id>/", views.chat, name="chat"),
    path("s/<uuid:share_id>/", views.shared, name="shared"),
    path("shares/", views.shared_by_me, name="shared-by-me"),
]
