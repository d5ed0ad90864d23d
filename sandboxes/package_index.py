"""The package index's window of one sandbox (``PAW_SANDBOX_PACKAGE_INDEX``): the one place
it opens and closes.

With an isolated network a sandbox reaches the package index only while an approved
``install_package`` call runs: the window opens when the answer op approving that very
call is written (before it: pip starts as soon as the runtime reads it), and closes at the
run's next tool result or its end, or at once when the answer could not be written. With
``host`` networking there is nothing to open. Keyed on the approved call itself
(:attr:`~conversations.selectors.runs.AnswerOp.approved_call`, its ``name``), never on
the confirm's wording.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sandboxes import protocol

if TYPE_CHECKING:
    from sandboxes.network import SandboxNetwork
    from sandboxes.run import ReadEntry

logger = logging.getLogger(__name__)

#: The tool whose approved call opens the window.
INSTALL_TOOL = "install_package"


class PackageIndexWindow:
    """The window of the sandbox ``sandbox_id``, whose forwarder ``network()`` returns
    (``None``: no isolated network)."""

    def __init__(self, sandbox_id: Any, network: Callable[[], SandboxNetwork | None]) -> None:
        self.sandbox_id = sandbox_id
        self._network = network

    @property
    def is_open(self) -> bool:
        network = self._network()
        return network is not None and network.index_open

    def answer(self, *, approved_call: dict[str, Any] | None, write: Callable[[], Any]) -> None:
        """Write an answer op (``write``); when it approves an ``install_package`` call
        (``approved_call``), open the window first, and close it again when ``write``
        raises (the exception goes on)."""
        opened = self._open() if _installs(approved_call) else False
        try:
            write()
        except BaseException:
            if opened:
                self._close()
            raise

    def watch(self, entries: list[ReadEntry]) -> None:
        """Close an open window at the first tool result (``notify tool``) or ``result``
        among the lines just read (``entries``)."""
        if not self.is_open:
            return
        for entry in entries:
            line = entry.line
            if isinstance(line, protocol.RunLine) and (
                line.type == "result" or (line.type == "notify" and line.kind == "tool")
            ):
                self._close()
                logger.info("sandbox %s: the package index is closed", self.sandbox_id)
                return

    def _open(self) -> bool:
        """Allow the package index; whether the sandbox has an isolated network."""
        network = self._network()
        if network is None:
            return False
        network.index_open = True
        logger.info("sandbox %s: the package index is open for an install", self.sandbox_id)
        return True

    def _close(self) -> None:
        network = self._network()
        if network is not None:
            network.index_open = False


def _installs(call: dict[str, Any] | None) -> bool:
    """Whether ``call`` (an approved confirm's) is an ``install_package`` call."""
    return isinstance(call, dict) and call.get("name") == INSTALL_TOOL
