"""A sandbox's environment is built from scratch and its resource limits apply: what the
agent's own code sees (``run_python``) and what every process of the sandbox was started
with, compared with the worker process that started it."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

import pytest

from conversations.models import Run
from conversations.selectors.workspaces import PRIVATE_DIR
from conversations.services.runs import run_start
from conversations.services.workspaces import workspace_ensure
from sandboxes.models import Sandbox
from sandboxes.network import FIRST_FORWARD_PORT, PROXY_PORT
from tests.conftest import PAW_AGENT, SCRIPTED_API_KEY
from tests.factories import ConversationFactory
from tests.live import wait_for
from tests.sandboxes.observe import (
    finished,
    marked_processes,
    process_command_line,
    process_environment,
    resource_limits,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LIMITS = {
    "PAW_SANDBOX_CPU_SECONDS": "123",
    "PAW_SANDBOX_MEMORY_MB": "3500",
    "PAW_SANDBOX_FILE_MB": "77",
    "PAW_SANDBOX_PROCESSES": "345",
}
# What the worker has and no sandbox may get (set on the worker by this test).
CANARIES = {"AWS_SECRET_ACCESS_KEY": "canary-aws-secret", "PAW_TEST_CANARY": "canary-value"}
# The server's own settings, which the worker has from the test environment.
SERVER_VARIABLES = (
    "PAW_SECRET_KEY",
    "PAW_DATABASE_URL",
    "PAW_REDIS_URL",
    "DJANGO_SETTINGS_MODULE",
    "PAW_LLM_API_KEY",
    "PAW_VAR_DIR",
    "PAW_WORKSPACE_ROOT",
)
# The base environment of every sandbox (docs/runtime.md, "The process"): a worker variable of the
# same name may reach the sandbox only with the sandbox's own value.
BASE = {
    "PATH", "LANG", "LC_ALL", "HOME", "TMPDIR", "NO_PROXY", "no_proxy", "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE", "MPLBACKEND",
}  # fmt: skip
PRIVATE = ("HOME", "TMPDIR", "XDG_DATA_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_STATE_HOME")

DUMP = """
import json, os
with open("/proc/self/limits") as f:
    limits = f.read()
with open("sandbox_env.json", "w") as f:
    json.dump({"environ": dict(os.environ), "limits": limits}, f)
print("dumped")
"""


def expected_limits() -> dict[str, tuple[str, str]]:
    """``LIMITS`` as ``/proc/<pid>/limits`` shows them (soft and hard alike)."""
    mb = 1024 * 1024
    values = {
        "Max cpu time": LIMITS["PAW_SANDBOX_CPU_SECONDS"],
        "Max address space": str(int(LIMITS["PAW_SANDBOX_MEMORY_MB"]) * mb),
        "Max file size": str(int(LIMITS["PAW_SANDBOX_FILE_MB"]) * mb),
        "Max processes": LIMITS["PAW_SANDBOX_PROCESSES"],
    }
    return {name: (value, value) for name, value in values.items()}


def leaks(environ: dict[str, str], worker: dict[str, str]) -> set[str]:
    """Names in ``environ`` that came from the ``worker``'s environment: a server variable,
    or any worker variable outside the base environment, or a worker's secret value under
    any name."""
    found = {name for name in (*SERVER_VARIABLES, *CANARIES) if name in environ}
    found |= {
        name for name, value in worker.items() if name not in BASE and environ.get(name) == value
    }
    secrets = {worker[name] for name in ("PAW_SECRET_KEY", "PAW_DATABASE_URL", "PAW_REDIS_URL")}
    secrets |= set(CANARIES.values())
    found |= {name for name, value in environ.items() if any(s in value for s in secrets)}
    return found


def test_the_sandbox_gets_a_fresh_environment_private_folders_and_the_configured_limits(
    worker_node, scripted_model
):
    # A sandbox spawned for its run (a spare's start environment and hand-over:
    # tests/sandboxes/test_spares.py).
    worker_node.use(PAW_AGENT, PAW_SANDBOX_SPARES="0", **LIMITS, **CANARIES)
    worker = process_environment(worker_node.process.pid)
    assert set(SERVER_VARIABLES) | set(CANARIES) <= set(worker)  # so there is something to leak
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "responses": [
                {"tool_calls": [{"name": "run_python", "arguments": {"code": DUMP}}]},
                "Dumped.",
            ],
        }
    )
    scripted_model.clear_log()  # this test's requests only (the session's model served others)
    conversation = ConversationFactory()
    workspace = workspace_ensure(conversation.id)
    run = run_start(
        user=conversation.user, conversation_id=conversation.id, prompt="Dump your environment."
    )
    run = wait_for(lambda: finished(run.id), timeout=60)
    assert run.status == Run.Status.DONE, run.errors
    private = f"{workspace / PRIVATE_DIR}/"

    # What the agent's code sees.
    dump = json.loads((workspace / "sandbox_env.json").read_text())
    environ = dump["environ"]
    assert leaks(environ, worker) == set()
    assert {name: environ.get(name, "")[: len(private)] for name in PRIVATE} == dict.fromkeys(
        PRIVATE, private
    )
    limits = resource_limits(dump["limits"])
    assert {name: limits[name] for name in expected_limits()} == expected_limits()

    # What every process of the sandbox (the runtime, its kernel …) was started with.
    sandbox = Sandbox.objects.get(conversation=conversation, state__in=Sandbox.LIVE_STATES)
    processes = marked_processes(sandbox.id)
    runtimes = [
        pid for pid in processes if any("paw-agent" in a for a in process_command_line(pid))
    ]
    assert runtimes, [process_command_line(pid) for pid in processes]
    for pid in processes:
        started_with = process_environment(pid)
        assert leaks(started_with, worker) == set(), process_command_line(pid)
        assert all(started_with[name].startswith(private) for name in PRIVATE)
        with open(f"/proc/{pid}/limits") as f:
            limits = resource_limits(f.read())
        assert {name: limits[name] for name in expected_limits()} == expected_limits()
    runtime = process_environment(runtimes[0])
    if "--unshare-net" in process_command_line(runtimes[0]):
        # An isolated network (the default under bubblewrap): the plain-HTTP endpoint is
        # reached through the relay's first TCP forward, everything else through its proxy.
        path = urlsplit(scripted_model.base_url).path
        assert runtime["OPENAI_BASE_URL"] == f"http://127.0.0.1:{FIRST_FORWARD_PORT}{path}"
        assert runtime["HTTPS_PROXY"] == f"http://127.0.0.1:{PROXY_PORT}"
    else:
        assert runtime["OPENAI_BASE_URL"] == scripted_model.base_url
    assert runtime["OPENAI_MODEL"] == "scripted-model"
    # The key itself came through a pipe (--secrets-fd), so it is in no environment that
    # /proc shows; the model was called with it all the same.
    assert "OPENAI_API_KEY" not in runtime
    assert "--secrets-fd" in process_command_line(runtimes[0])
    assert {entry["authorization"] for entry in scripted_model.log} == {
        f"Bearer {SCRIPTED_API_KEY}"
    }
