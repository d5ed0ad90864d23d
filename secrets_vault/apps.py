from django.apps import AppConfig


class SecretsVaultConfig(AppConfig):
    """Encrypted secrets, SQL datasources and model providers."""

    name = "secrets_vault"
    verbose_name = "Secrets, datasources and providers"
