"""REST API of the secrets vault: users' secrets, datasources and providers, plus the
staff-only operator endpoints under ``/api/admin/``."""
