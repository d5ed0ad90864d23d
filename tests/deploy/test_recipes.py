"""What an operator copies from ``deploy/``, checked as far as this machine can: every
command the systemd units and the Compose file run is started here, exactly as written
(with the test's database, Redis and folders), and must make a ready PAW (``/readyz``)
that runs a real run; beat really schedules; the worker stops its sandboxes within its
unit's stop timeout; and ``manage.py check --deploy`` finds nothing under the production
settings they set."""

from __future__ import annotations

import configparser
import json
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import urllib.request
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from django.conf import settings
from django.utils import timezone

from accounts.models import User
from conversations.models import Run
from sandboxes.models import Sandbox, WorkerNode
from sandboxes.node import STOP_SECONDS_MAX
from sandboxes.process import SUBMIT_ACK_TIMEOUT
from tests.conftest import SCRIPTED_API_KEY
from tests.live import wait_for
from tests.processes import (
    PYTHON,
    ROOT,
    child_process,
    free_port,
    http_get,
    output_of,
    private_redis_url,
    wait_http,
    worker_database_url,
)
from tests.sandboxes.observe import process_alive

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

DEPLOY = ROOT / "deploy"
UNITS = DEPLOY / "systemd"
#: Where the units expect PAW: the checkout and the virtualenv `make install` makes in it.
APP_DIR = "/opt/paw"
UNIT_PYTHON = "/opt/paw/.venv/bin/python"
ENV_FILE = "/etc/paw/paw.env"
WAIT = 90


# --- reading the recipes --------------------------------------------------------------------


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None, strict=True)
    parser.optionxform = str  # systemd keys are case-sensitive
    parser.read(UNITS / name)
    return parser


def env_file(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines (systemd's EnvironmentFile and Compose's env_file alike)."""
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def production_environment(base: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The recipe's environment with its secrets filled in and pointed at this test's
    services and folders (the one part that cannot be the operator's)."""
    env = {
        key: (secrets.token_urlsafe(50) if value == "change-me" else value)
        for key, value in base.items()
    }
    env.update(
        {
            "PAW_DATABASE_URL": worker_database_url(),
            # Not the suite's own: its worker node would take the recipe's runs.
            "PAW_REDIS_URL": private_redis_url(),
            "PAW_VAR_DIR": str(tmp_path / "var"),
            "PAW_WORKSPACE_ROOT": os.environ["PAW_WORKSPACE_ROOT"],
            "PAW_NODE_NAME": f"deploy-{os.getpid()}-{tmp_path.name[-12:]}",
            "PAW_WORKER_METRICS_PORT": str(free_port()),
            "PAW_WORKER_METRICS_HOST": "127.0.0.1",
        }
    )
    return env


def systemd_recipe(tmp_path: Path) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """``({role: command}, {role: environment})`` of the units, as systemd would run them
    (``%i``: the web instance's port)."""
    port = str(free_port())
    env = production_environment(env_file(DEPLOY / "paw.env"), tmp_path)
    commands = {}
    for role, name in (
        ("web", "paw-web@.service"),
        ("worker", "paw-worker.service"),
        ("beat", "paw-beat.service"),
    ):
        service = unit(name)["Service"]
        assert service["EnvironmentFile"] == ENV_FILE and service["WorkingDirectory"] == APP_DIR
        argv = shlex.split(service["ExecStart"].replace("%i", port))
        assert argv[0] == UNIT_PYTHON, argv
        commands[role] = [PYTHON, *argv[1:]]
    return commands, dict.fromkeys(commands, env)


def compose_recipe(tmp_path: Path) -> tuple[dict[str, list[str]], dict[str, dict[str, str]]]:
    """The same from the Compose file: each service's command and env_file + environment
    (the published port and the listening address moved to loopback, a free port)."""
    services = compose()["services"]
    port = str(free_port())
    commands, environments = {}, {}
    for role in ("migrate", "web", "worker", "beat"):
        service = services[role]
        assert service["env_file"] == "paw.env"
        argv = service["command"]
        assert argv[0] == "python", argv
        argv = [
            PYTHON,
            *("127.0.0.1" if a == "0.0.0.0" else port if a == "8000" else a for a in argv[1:]),  # noqa: S104
        ]
        commands[role] = argv
        base = {
            **env_file(DEPLOY / "paw.env"),
            **{k: str(v) for k, v in service["environment"].items()},
        }
        environments[role] = production_environment(base, tmp_path)
    return commands, environments


RECIPES = {"systemd": systemd_recipe, "compose": compose_recipe}


# --- the checks that need no process ------------------------------------------------------------


@pytest.mark.parametrize("name", ["paw-web@.service", "paw-worker.service", "paw-beat.service"])
def test_each_unit_restarts_reads_the_one_environment_file_and_runs_paw_from_its_virtualenv(name):
    service = unit(name)["Service"]
    assert service["Restart"] == "always"
    assert service["EnvironmentFile"] == ENV_FILE
    assert service["ExecStart"].startswith(f"{UNIT_PYTHON} -m paw_project.")
    assert service["User"] == "paw" and service["UMask"] == "0077"


def test_the_worker_unit_stops_only_the_worker_and_waits_longer_than_its_sandbox_shutdown():
    service = unit("paw-worker.service")["Service"]
    # The worker stops its sandboxes itself; systemd must not signal them at the same time.
    assert service["KillMode"] == "mixed"
    longest_task = settings.PAW_SANDBOX_READY_TIMEOUT + 2 * SUBMIT_ACK_TIMEOUT
    assert int(service["TimeoutStopSec"]) > longest_task + STOP_SECONDS_MAX
    stop_grace = compose()["services"]["worker"]["stop_grace_period"]
    assert int(stop_grace.removesuffix("s")) == int(service["TimeoutStopSec"])


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_finds_nothing_in_the_units(tmp_path):
    """systemd's own parser: an unknown key or a bad value is reported (and then ignored by
    systemd, which is why it must be caught here). Paths are pointed at this machine."""
    names = []
    for source in sorted(UNITS.glob("*.service")):
        text = source.read_text()
        text = text.replace(UNIT_PYTHON, PYTHON).replace(ENV_FILE, str(DEPLOY / "paw.env"))
        text = text.replace(f"WorkingDirectory={APP_DIR}", f"WorkingDirectory={ROOT}")
        name = source.name.replace("@.", "@8000.")
        (tmp_path / name).write_text(text)
        names.append(f"./{name}")
    result = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", *names],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "SYSTEMD_LOG_LEVEL": "notice"},
        timeout=60,
    )
    assert result.returncode == 0 and not (result.stdout + result.stderr).strip(), result.stderr


def test_the_compose_file_has_postgres_redis_web_worker_and_beat_on_one_environment_file():
    services = compose()["services"]
    assert {"postgres", "redis", "web", "worker", "beat", "migrate"} <= set(services)
    for role in ("web", "worker", "beat", "migrate"):
        assert services[role]["env_file"] == "paw.env"
        assert services[role]["build"]["dockerfile"] == "deploy/Dockerfile"
    assert services["web"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert "--requirepass" in services["redis"]["command"]


@pytest.mark.parametrize("recipe", RECIPES)
def test_manage_py_check_deploy_finds_nothing_under_the_production_settings(recipe, tmp_path):
    _, environments = RECIPES[recipe](tmp_path)
    result = subprocess.run(
        [PYTHON, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        cwd=ROOT,
        env={**os.environ, **environments["web"], "PAW_DEBUG": "0"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues" in result.stdout


# --- the commands, started -------------------------------------------------------------------------


def api(base: str, method: str, path: str, token: str, body: object = None) -> tuple[int, dict]:
    """A call as nginx forwards it (``X-Forwarded-Proto: https``: the production settings
    redirect plain HTTP)."""
    request = urllib.request.Request(  # noqa: S310 - loopback
        f"{base}{path}",
        method=method,
        data=None if body is None else json.dumps(body).encode(),
        headers={
            **({"Authorization": f"Bearer {token}"} if token else {}),
            "Content-Type": "application/json",
            "X-Forwarded-Proto": "https",
        },
    )
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
        return response.status, json.loads(response.read())


@pytest.mark.parametrize("recipe", RECIPES)
def test_the_recipes_commands_make_a_ready_paw_that_runs_schedules_and_stops_cleanly(
    recipe, tmp_path, scripted_model
):
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "fallback": "Done."})
    commands, environments = RECIPES[recipe](tmp_path)
    model = {
        "PAW_LLM_BASE_URL": scripted_model.base_url,
        "PAW_LLM_API_KEY": SCRIPTED_API_KEY,
        "PAW_LLM_MODEL": "scripted-model",
    }
    if "migrate" in commands:  # a one-shot service before the others
        result = subprocess.run(
            commands["migrate"], cwd=ROOT, env={**os.environ, **environments["migrate"]},
            capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
    # A node that stopped answering long ago: beat's schedule makes the worker reap it.
    lost = WorkerNode.objects.create(
        name=f"lost-{tmp_path.name[-12:]}", heartbeat_at=timezone.now() - timedelta(hours=1)
    )
    port = commands["web"][commands["web"].index("--port") + 1]
    base = f"http://127.0.0.1:{port}"
    with ExitStack() as stack:
        processes = {
            role: stack.enter_context(
                child_process(commands[role], env={**environments[role], **model}, grace=200)
            )
            for role in ("web", "worker", "beat")
        }
        wait_http(f"{base}/healthz", process=processes["web"])

        def ready() -> bool:
            for role, process in processes.items():
                assert process.poll() is None, f"{role} exited:\n{output_of(process)}"
            return http_get(f"{base}/readyz")[0] == 200

        wait_for(ready, timeout=WAIT, interval=0.5, what="/readyz to answer 200")
        wait_for(
            lambda: WorkerNode.objects.get(id=lost.id).stopped_at is not None,
            timeout=WAIT,
            what="beat's reaping of the lost node",
        )

        # A real run through the web process and the worker node.
        # Signed in through the API: the recipe's processes have a secret key of their own.
        User.objects.create_user(username=f"deploy-{recipe}", password="x" * 20)
        _, pair = api(
            base,
            "POST",
            "/api/auth/token",
            "",
            {"username": f"deploy-{recipe}", "password": "x" * 20},
        )
        token = pair["access"]
        _, conversation = api(base, "POST", "/api/conversations", token, {})
        status, run = api(
            base, "POST", f"/api/conversations/{conversation['id']}/runs", token, {"prompt": "Hi"}
        )
        assert status == 202
        run = wait_for(
            lambda: Run.objects.filter(id=run["id"], status__in=Run.FINISHED_STATUSES).first(),
            timeout=WAIT,
            what="the run to end",
        )
        assert run.status == Run.Status.DONE, run.errors
        sandbox = Sandbox.objects.get(conversation_id=conversation["id"], state=Sandbox.State.READY)
        assert sandbox.node == environments["worker"]["PAW_NODE_NAME"], sandbox.node
        assert process_alive(sandbox.pid)

        # Stopped as systemd (KillMode=mixed) and Compose do: SIGTERM to the worker alone.
        worker = processes["worker"]
        os.kill(worker.pid, signal.SIGTERM)
        timeout = int(unit("paw-worker.service")["Service"]["TimeoutStopSec"])
        assert worker.wait(timeout=timeout) == 0, output_of(worker)
        # Its sandboxes end with it (it stops them; were it killed, their parent-death
        # signal would).
        wait_for(lambda: not process_alive(sandbox.pid), timeout=5, what="the sandbox to end")
        sandbox.refresh_from_db()
        assert sandbox.state == Sandbox.State.STOPPED
