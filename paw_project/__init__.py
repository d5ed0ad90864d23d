"""PAW's Django project package. The Celery app is loaded here so ``shared_task`` binds to it."""

from paw_project.celery import app as celery_app

__all__ = ("celery_app",)
