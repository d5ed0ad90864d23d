"""Writes of the secrets vault, split by concern; import from here.

- ``secrets``: secrets (set, create, update, delete, re-encrypt) and ``{secret:NAME}``
  placeholder resolution
- ``datasources``: datasources (create, update, delete, validate for a run, test)
- ``knowledge``: datasource knowledge (entries, schema refresh, vectors, what a run gets)
- ``providers``: the provider and model of a run (:func:`provider_resolve`), user defaults
- ``provider_access``: who may use which provider and model (:func:`provider_access_set`)
- ``sandbox``: what a sandbox is given (:func:`sandbox_environment`)
- ``demo``: the offline demo's datasource (the tips data set as SQLite)
"""

from secrets_vault.services.datasources import (
    CREDENTIAL_FIELDS,
    DatasourceConnection,
    KeptDatasources,
    datasource_connection,
    datasource_create,
    datasource_credential_create,
    datasource_credential_delete,
    datasource_credential_save,
    datasource_credential_update,
    datasource_delete,
    datasource_paw_database_check,
    datasource_privileges_check,
    datasource_privileges_enforce,
    datasource_resolve,
    datasource_resolved,
    datasource_save,
    datasource_test,
    datasource_update,
    datasources_available,
    datasources_kept,
    datasources_validate,
    schema_values_forget,
)
from secrets_vault.services.demo import (
    DEMO_DATASOURCE_SLUG,
    demo_datasource_ensure,
    demo_tips_database,
)
from secrets_vault.services.knowledge import (
    IndexSource,
    RunKnowledge,
    datasource_schema_refresh,
    datasource_schema_refresh_request,
    knowledge_entry_create,
    knowledge_entry_delete,
    knowledge_entry_update,
    knowledge_entry_validate,
    knowledge_example_check,
    knowledge_for_run,
    knowledge_index_write,
)
from secrets_vault.services.provider_access import provider_access_set
from secrets_vault.services.providers import (
    ProviderChoice,
    custom_provider_save,
    provider_choice_check,
    provider_default_set,
    provider_resolve,
)
from secrets_vault.services.sandbox import (
    RunDatasource,
    SandboxEnvironment,
    prompt_secret_values,
    sandbox_environment,
    stored_secret_values,
)
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
    "CREDENTIAL_FIELDS",
    "DEMO_DATASOURCE_SLUG",
    "DatasourceConnection",
    "IndexSource",
    "KeptDatasources",
    "ProviderChoice",
    "ReencryptResult",
    "Resolved",
    "RunDatasource",
    "RunKnowledge",
    "SandboxEnvironment",
    "custom_provider_save",
    "datasource_connection",
    "datasource_create",
    "datasource_credential_create",
    "datasource_credential_delete",
    "datasource_credential_save",
    "datasource_credential_update",
    "datasource_delete",
    "datasource_paw_database_check",
    "datasource_privileges_check",
    "datasource_privileges_enforce",
    "datasource_resolve",
    "datasource_resolved",
    "datasource_save",
    "datasource_schema_refresh",
    "datasource_schema_refresh_request",
    "datasource_test",
    "datasource_update",
    "datasources_available",
    "datasources_kept",
    "datasources_validate",
    "demo_datasource_ensure",
    "demo_tips_database",
    "knowledge_entry_create",
    "knowledge_entry_delete",
    "knowledge_entry_update",
    "knowledge_entry_validate",
    "knowledge_example_check",
    "knowledge_for_run",
    "knowledge_index_write",
    "model_validate",
    "placeholders_resolve",
    "prompt_secret_values",
    "provider_access_set",
    "provider_choice_check",
    "provider_default_set",
    "provider_resolve",
    "sandbox_environment",
    "schema_values_forget",
    "secret_create",
    "secret_delete",
    "secret_save",
    "secret_set",
    "secret_update",
    "secrets_mark_used",
    "secrets_reencrypt",
    "stored_secret_values",
]
