"""The offline demo's provider name, shared by the apps that must tell its runs apart
without importing each other: ``secrets_vault.providers`` offers the demo under it, and
``billing`` marks its usage as demo usage and keeps it out of budgets (billing may not
import ``secrets_vault``: ``secrets_vault`` → ``accounts`` → ``billing``)."""

#: The offline demo's scripted model (``PAW_DEMO_BASE_URL``), offered after every other.
DEMO_PROVIDER_NAME = "demo"
