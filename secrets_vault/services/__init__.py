"""Writes of the secrets vault, split by concern; import from here.

- ``secrets``: secrets (set, create, update, delete, re-encrypt) and ``{secret:NAME}``
  placeholder resolution
- ``datasources``: datasources (create, update, delete, validate for a run, test)
- ``providers``: the provider and model of a run (:func:`provider_resolve`), user defaults
- ``sandbox``: what a sandbox is given (:func:`sandbox_environment`)
"""

from secrets_vault.services.datasources import (
    DatasourceConnection,
    datasource_connection,
    datasource_create,
    datasource_delete,
    datasource_save,
    datasource_test,
    datasource_update,
    datasources_validate,
)
from secrets_vault.services.providers import (
    ProviderChoice,
    custom_provider_save,
    provider_default_set,
    provider_resolve,
)
from secrets_vault.services.sandbox import SandboxEnvironment, sandbox_environment
from secrets_vault.services.secrets import (
    ReencryptResult,
    Resolved,
    model_validate,
    placeholders_resolve,
    secret_create,
    secret_delete,
    secret_save,
    secret_set,
    secret_update,
    secrets_mark_used,
    secrets_reencrypt,
)

__all__ = [
    "DatasourceConnection",
    "ProviderChoice",
    "ReencryptResult",
    "Resolved",
    "SandboxEnvironment",
    "custom_provider_save",
    "datasource_connection",
    "datasource_create",
    "datasource_delete",
    "datasource_save",
    "datasource_test",
    "datasource_update",
    "datasources_validate",
    "model_validate",
    "placeholders_resolve",
    "provider_default_set",
    "provider_resolve",
    "sandbox_environment",
    "secret_create",
    "secret_delete",
    "secret_save",
    "secret_set",
    "secret_update",
    "secrets_mark_used",
    "secrets_reencrypt",
]
