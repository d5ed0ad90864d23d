"""What sandbox tests look at from the outside: the machine's process table (``/proc``, as
an operator would check it), the runs and sandboxes in the database, and what the scripted
model was sent."""

from __future__ import annotations

import json
import os
import re
from typing import Any

from conversations.models import Run
from sandboxes.models import Sandbox


def finished(run_id: Any) -> Run | None:
    """The run once it has finished (done, error or cancelled), else ``None``."""
    return Run.objects.filter(id=run_id, status__in=Run.FINISHED_STATUSES).first()


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot, field 22 of ``/proc/<pid>/stat``), or
    ``None`` when it is gone. With the pid it names one process: a new process that got
    the same pid has another start time."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().split(")")[-1].split()[19])
    except (FileNotFoundError, ProcessLookupError):
        return None


def process_environment(pid: int) -> dict[str, str]:
    """The environment ``pid`` was started with (``/proc/<pid>/environ``); ``{}`` when it
    is gone."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return {}
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}


def process_command_line(pid: int) -> list[str]:
    """The arguments of ``pid`` (``[]`` when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [arg.decode(errors="replace") for arg in f.read().split(b"\0") if arg]
    except OSError:
        return []


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def marked_processes(sandbox_id: Any) -> list[int]:
    """Processes (anywhere on the machine) carrying the sandbox's environment marker."""
    needle = f"PAW_SANDBOX_ID={sandbox_id}".encode()
    found = []
    for pid in _pids():
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(pid)
        except OSError:
            continue
    return [pid for pid in found if process_alive(pid)]


def processes_with_argument(argument: str) -> list[int]:
    """Live processes (anywhere on the machine) with ``argument`` on their command line."""
    return [pid for pid in _pids() if argument in process_command_line(pid) and process_alive(pid)]


def resource_limits(text: str) -> dict[str, tuple[str, str]]:
    """``/proc/<pid>/limits`` parsed: ``{"Max cpu time": ("123", "123"), ...}`` (soft and
    hard limit, as written: a number or ``unlimited``)."""
    limits = {}
    for line in text.splitlines()[1:]:
        match = re.match(r"(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)", line)
        if match:
            limits[match[1]] = (match[2], match[3])
    return limits


def sandbox_pids(conversation) -> list[int | None]:
    """The pids of the conversation's sandboxes, oldest first."""
    return list(
        Sandbox.objects.filter(conversation=conversation)
        .order_by("started_at")
        .values_list("pid", flat=True)
    )


def model_saw(scripted_model, text: str) -> bool:
    """Whether any request the scripted model logged carried ``text`` in its messages."""
    return any(
        text in json.dumps(entry["body"].get("messages", [])) for entry in scripted_model.log
    )
