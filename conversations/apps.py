from django.apps import AppConfig


class ConversationsConfig(AppConfig):
    """Conversations, their files, runs, events and approvals; the chat page and websocket."""

    name = "conversations"
