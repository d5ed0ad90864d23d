"""paw-client: Python client for PAW (Python Agent Web).

- :class:`Client`: one method per public endpoint of PAW's REST API; :class:`Conversation`
  and :class:`Run` handles; a run's events from the websocket exactly once, in order,
  across reconnects; approvals through ``on_approval`` or :class:`ApprovalRequired`.
- ``paw``: the terminal command (:mod:`paw_client.cli`).
- ``%load_ext paw_client``: the ``%paw_connect``, ``%%agent`` and ``%agent fix`` IPython magics
  (:mod:`paw_client.magic`).

There is no asyncio twin (``AsyncClient``): see docs/client.md for why and what to use.
"""

from __future__ import annotations

from typing import Any

from paw_client.client import Client, Conversation, Run, __version__
from paw_client.errors import (
    ApprovalClosed,
    ApprovalRequired,
    AuthenticationFailed,
    BudgetExhausted,
    Conflict,
    ConnectionFailed,
    InvalidRequest,
    NotFound,
    PawError,
    PayloadTooLarge,
    PermissionDenied,
    ProviderInactive,
    RateLimited,
    RunActive,
    RunFailed,
    ServerError,
)
from paw_client.models import (
    ApiToken,
    Approval,
    Artifact,
    Datasource,
    Event,
    File,
    Provider,
    RunError,
    Secret,
    Turn,
    Usage,
    UsageReport,
    User,
)

__all__ = [
    "ApiToken", "Approval", "ApprovalClosed", "ApprovalRequired", "Artifact",
    "AuthenticationFailed", "BudgetExhausted", "Client", "Conflict", "ConnectionFailed",
    "Conversation", "Datasource", "Event", "File", "InvalidRequest", "NotFound", "PawError",
    "PayloadTooLarge", "PermissionDenied", "Provider", "ProviderInactive", "RateLimited", "Run",
    "RunActive", "RunError", "RunFailed", "Secret", "ServerError", "Turn", "Usage", "UsageReport",
    "User", "__version__",
]  # fmt: skip


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext paw_client``: registers ``%paw_connect`` and ``%%agent``."""
    from paw_client.magic import PawMagics

    ipython.register_magics(PawMagics(ipython))
