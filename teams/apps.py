from django.apps import AppConfig


class TeamsConfig(AppConfig):
    """Teams: Django's ``auth.Group`` as the unit of access (who may use which datasource,
    model and budget), with the rule of an access setting in one place."""

    name = "teams"
    verbose_name = "Teams"
