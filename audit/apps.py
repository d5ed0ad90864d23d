from django.apps import AppConfig


class AuditConfig(AppConfig):
    """The audit of data access: the SQL statements runs sent to datasources (recorded on
    the node, append only), their admin list, the staff API and their retention."""

    name = "audit"
    verbose_name = "Audit"
