"""The audit's staff API (``GET /api/admin/audit``)."""
