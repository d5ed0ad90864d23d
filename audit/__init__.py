"""The audit of data access: every SQL statement a run sent to a datasource, recorded by
the node from what the runtime announced and returned (docs/data.md#the-audit-of-data-access)."""
