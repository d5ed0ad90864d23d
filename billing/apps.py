from django.apps import AppConfig


class BillingConfig(AppConfig):
    """The token-usage ledger and budgets."""

    name = "billing"
