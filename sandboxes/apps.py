from django.apps import AppConfig


class SandboxesConfig(AppConfig):
    """Sandboxes: the agent runtime processes owned by Celery workers, and their protocol."""

    name = "sandboxes"
