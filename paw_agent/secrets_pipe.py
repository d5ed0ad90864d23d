"""The secrets pipe (``--secrets-fd``): how the host hands paw-agent the variables its
tools must never read (the provider key, datasource URLs), and a spare all of a run's
variables, without argv or the environment block ``/proc/<pid>/environ`` shows."""

from __future__ import annotations

import json
import os


def read_secrets(fd: int) -> dict[str, str]:
    """The JSON object of string variables the host writes to pipe ``fd`` (read to its end,
    then closed). Put into ``os.environ`` they reach this process's own code, not its
    initial environment block that ``/proc/<pid>/environ`` shows. Raises ``ValueError``
    for anything but an object of strings."""
    with os.fdopen(fd, "rb") as pipe:
        data = json.loads(pipe.read() or b"{}")
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise ValueError("the secrets pipe must hold a JSON object of strings")
    return data
