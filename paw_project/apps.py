from django.apps import AppConfig


class PawProjectConfig(AppConfig):
    """The project package as an app: it holds the ``runpaw`` management command."""

    name = "paw_project"
    verbose_name = "PAW"
