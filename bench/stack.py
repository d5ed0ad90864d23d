"""A real PAW stack for benchmarks: its database, web processes (``paw_project.web``, as
``make run`` starts them) and a Celery worker node, on loopback, in Redis mode (as in
production). Used by ``bench/api.py`` and
``bench/events.py``; never by the product or the test suite.

Environment: ``PAW_BENCH_DATABASE_URL`` (default
``postgres://postgres@127.0.0.1:5432/paw_bench``; created and migrated if missing) and
``PAW_BENCH_REDIS_URL`` (default ``redis://127.0.0.1:6379/12``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def bench_env(**extra: str) -> dict[str, str]:
    """The environment of every process of the stack (plus ``extra``)."""
    var_dir = tempfile.mkdtemp(prefix="paw-bench-")
    return {
        **os.environ,
        "PAW_DATABASE_URL": os.environ.get(
            "PAW_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/paw_bench"
        ),
        "PAW_REDIS_URL": os.environ.get("PAW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12"),
        "PAW_SECRET_KEY": "paw-bench-secret-key-not-for-production",
        "PAW_DEBUG": "0",
        "PAW_VAR_DIR": var_dir,
        "PAW_WORKSPACE_ROOT": str(Path(var_dir) / "workspaces"),
        "PAW_LOG_LEVEL": "WARNING",
        **extra,
    }


def migrate(env: dict[str, str]) -> None:
    """Create the database if missing, then apply the migrations."""
    import psycopg

    database_url = env["PAW_DATABASE_URL"]
    name = database_url.rsplit("/", 1)[-1]
    admin = psycopg.connect(database_url.rsplit("/", 1)[0] + "/postgres", autocommit=True)
    with admin:
        if not admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            admin.execute(f'CREATE DATABASE "{name}"')
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "--noinput", "-v", "0"],
        cwd=ROOT,
        env=env,
        check=True,
    )


def manage_shell(script: str, env: dict[str, str]) -> str:
    """Run Python in ``manage.py shell``; its last line of output."""
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def bench_user_token(env: dict[str, str], *, conversations: int = 0) -> str:
    """A JWT access token of the user ``bench`` (whose old conversations are removed, and
    ``conversations`` new ones made); then the database is vacuumed, so that a run does not
    pay for the rows the runs before it left (autovacuum may be off, as on the machine
    these figures come from)."""
    script = (
        "from accounts.models import User\n"
        "from accounts.services import auth_token_pair_for\n"
        "from conversations.models import Conversation\n"
        "user, _ = User.objects.get_or_create(username='bench')\n"
        "Conversation.objects.filter(user=user).delete()\n"
        f"for n in range({conversations}):\n"
        "    Conversation.objects.create(user=user, title=f'bench {n}')\n"
        "print(auth_token_pair_for(user=user)['access'])\n"
    )
    token = manage_shell(script, env)
    import psycopg

    with psycopg.connect(env["PAW_DATABASE_URL"], autocommit=True) as connection:
        connection.execute("VACUUM ANALYZE")
    return token


def start_web(processes: int, env: dict[str, str]) -> tuple[list[subprocess.Popen], int]:
    """Web processes (``python -m paw_project.web --fd``, as ``runpaw`` starts them)
    sharing one listening socket on 127.0.0.1 (the kernel spreads connections over them);
    ``(processes, port)``."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    listener.set_inheritable(True)
    port = listener.getsockname()[1]
    fd = listener.fileno()
    children = [
        subprocess.Popen(
            [sys.executable, "-m", "paw_project.web", "--fd", str(fd)],
            cwd=ROOT,
            env=env,
            pass_fds=(fd,),
            stdout=subprocess.DEVNULL,
            stderr=sys.stderr,
            start_new_session=True,
        )
        for _ in range(processes)
    ]
    listener.close()  # the children hold it
    wait_port(port, children)
    return children, port


def start_worker(
    env: dict[str, str], *, node: str = "bench", concurrency: int = 8
) -> subprocess.Popen:
    """A Celery worker node (threads pool) consuming ``runs`` and ``sandbox.<node>``."""
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "paw_project", "--quiet", "worker", "--pool", "threads",
         "--concurrency", str(concurrency), "-n", f"paw@{node}", "-Q", f"runs,sandbox.{node}",
         "--loglevel", "WARNING", "--without-mingle", "--without-gossip"],
        cwd=ROOT, env={**env, "PAW_NODE_NAME": node}, stdout=subprocess.DEVNULL, stderr=sys.stderr,
        start_new_session=True,
    )  # fmt: skip
    script = (
        "from paw_project.celery import app; import time, sys\n"
        "deadline = time.monotonic() + 60\n"
        f"while not app.control.ping(destination=['paw@{node}'], timeout=0.5):\n"
        "    if time.monotonic() > deadline: sys.exit(1)\n"
        "print('up')\n"
    )
    try:
        manage_shell(script, env)
    except subprocess.CalledProcessError:
        stop([worker])
        raise SystemExit("the Celery worker did not start") from None
    return worker


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_port(port: int, children: list[subprocess.Popen], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline or any(c.poll() is not None for c in children):
                raise SystemExit("the web server did not start") from None
            time.sleep(0.2)


def stop(children: list[subprocess.Popen], timeout: float = 30) -> None:
    """SIGTERM each child (a worker then shuts its sandboxes down), SIGKILL stragglers."""
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
            child.wait()


@contextlib.contextmanager
def running(children: list[subprocess.Popen]) -> Iterator[None]:
    try:
        yield
    finally:
        stop(children)


def percentile(values: list[float], p: float) -> float:
    """The ``p`` quantile (0–1) of ``values`` (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p * len(ordered)))]
