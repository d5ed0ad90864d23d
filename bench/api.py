"""Benchmark: ``GET /api/conversations`` (10 items) under concurrent load, against real
Daphne processes on PostgreSQL, over loopback.

    .venv/bin/python bench/api.py [--clients 50] [--seconds 10] [--web-processes 2]

It creates (or reuses) the database ``PAW_BENCH_DATABASE_URL`` (default
``postgres://postgres@127.0.0.1:5432/paw_bench``), migrates it, makes a user with 10
conversations and a JWT, starts ``--web-processes`` Daphne processes sharing one listening
socket (``daphne --fd``; the kernel spreads connections over them), then runs ``--clients``
keep-alive HTTP/1.1 connections as fast as they get answers for ``--seconds`` after a
2-second warm-up, and prints requests/s and latency percentiles. Every answer must be a
200 with 10 items, or the run fails. Redis (``PAW_BENCH_REDIS_URL``, default
``redis://127.0.0.1:6379/12``) is the cache, as in production. Only loopback is used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATH = "/api/conversations"


def prepare(database_url: str, env: dict[str, str]) -> str:
    """Create and migrate the database, the user and 10 conversations; return a token."""
    import psycopg

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
    script = (
        "from accounts.models import User\n"
        "from accounts.services import auth_token_pair_for\n"
        "from conversations.models import Conversation\n"
        "user, _ = User.objects.get_or_create(username='bench')\n"
        "Conversation.objects.filter(user=user).delete()\n"
        "for n in range(10):\n"
        "    Conversation.objects.create(user=user, title=f'bench {n}')\n"
        "print(auth_token_pair_for(user=user)['access'])\n"
    )
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", script],
        cwd=ROOT,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip().splitlines()[-1]


def start_web(processes: int, env: dict[str, str]) -> tuple[list[subprocess.Popen], int]:
    """Daphne processes sharing one listening socket on 127.0.0.1; (processes, port)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1024)
    listener.set_inheritable(True)
    port = listener.getsockname()[1]
    fd = listener.fileno()
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "daphne",
                "--fd",
                str(fd),
                "--proxy-headers",
                "-v",
                "0",
                "paw_project.asgi:application",
            ],
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
    return children, port


async def one_connection(
    port: int,
    request: bytes,
    until: float,
    record_from: float,
    latencies: list[float],
    check: bool,
) -> int:
    """Send requests one after another on one keep-alive connection; returns errors."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    errors = 0
    try:
        while True:
            started = time.perf_counter()
            if started >= until:
                return errors
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head.split(b" ", 2)[1])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":", 1)[1])
            body = await reader.readexactly(length)
            finished = time.perf_counter()
            if status != 200 or (check and len(json.loads(body)["results"]) != 10):
                errors += 1
            if started >= record_from:
                latencies.append(finished - started)
    finally:
        writer.close()


async def load(
    port: int, token: str, clients: int, seconds: float, warmup: float, path: str = PATH
) -> dict:
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nAccept: application/json\r\n\r\n"
    ).encode()
    latencies: list[float] = []
    start = time.perf_counter()
    record_from, until = start + warmup, start + warmup + seconds
    errors = await asyncio.gather(
        *(
            one_connection(port, request, until, record_from, latencies, path == PATH)
            for _ in range(clients)
        )
    )
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "requests": len(latencies),
        "errors": sum(errors),
        "requests_per_s": round(len(latencies) / seconds, 1),
        "p50_ms": round(pct(0.50), 1),
        "p90_ms": round(pct(0.90), 1),
        "p99_ms": round(pct(0.99), 1),
        "max_ms": round(latencies[-1] * 1000, 1),
        "mean_ms": round(statistics.fmean(latencies) * 1000, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--web-processes", type=int, default=2)
    parser.add_argument(
        "--path", default=PATH, help="another GET path, for comparison (e.g. /healthz)"
    )
    args = parser.parse_args()

    database_url = os.environ.get(
        "PAW_BENCH_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/paw_bench"
    )
    var_dir = tempfile.mkdtemp(prefix="paw-bench-")
    env = {
        **os.environ,
        "PAW_DATABASE_URL": database_url,
        "PAW_REDIS_URL": os.environ.get("PAW_BENCH_REDIS_URL", "redis://127.0.0.1:6379/12"),
        "PAW_SECRET_KEY": "paw-bench-secret-key-not-for-production",
        "PAW_DEBUG": "0",
        "PAW_VAR_DIR": var_dir,
        "PAW_LOG_LEVEL": "WARNING",
    }
    token = prepare(database_url, env)
    children, port = start_web(args.web_processes, env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or any(c.poll() is not None for c in children):
                    raise SystemExit("Daphne did not start") from None
                time.sleep(0.2)
        result = asyncio.run(load(port, token, args.clients, args.seconds, args.warmup, args.path))
    finally:
        for child in children:
            child.terminate()
        for child in children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
    result.update(
        path=args.path,
        clients=args.clients,
        seconds=args.seconds,
        web_processes=args.web_processes,
        cpus=os.cpu_count(),
    )
    print(json.dumps(result, indent=2))
    if result["errors"]:
        raise SystemExit(f"{result['errors']} answers were not a 200 with 10 items")


if __name__ == "__main__":
    main()
