"""Benchmark: ``GET /api/conversations`` (10 items) under concurrent load, against real
web processes (uvicorn, ``paw_project.web``) on PostgreSQL, over loopback.

    .venv/bin/python bench/api.py [--clients 50] [--seconds 10] [--web-processes 2]

It creates (or reuses) the database ``PAW_BENCH_DATABASE_URL`` (default
``postgres://postgres@127.0.0.1:5432/paw_bench``), migrates it, makes a user with 10
conversations and a JWT, starts ``--web-processes`` web processes sharing one
listening socket (``python -m paw_project.web --fd``; the kernel spreads connections over
them), then runs ``--clients`` keep-alive HTTP/1.1 connections as fast as they get
answers for ``--seconds`` after a 2-second warm-up, and prints requests/s, latency
percentiles, the web processes' CPU per answer (``web_cpu_ms_per_request``, user plus
system time over the measured seconds, from ``/proc``) and issue 16's targets per web
process (``target``, ``met``). Every answer must be a 200 with 10 items, or the run fails.
Redis (``PAW_BENCH_REDIS_URL``, default ``redis://127.0.0.1:6379/12``) is the cache, as
in production. Only loopback is used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from pathlib import Path

from stack import bench_env, bench_user_token, migrate, running, start_web

PATH = "/api/conversations"
#: Issue 16's targets for the conversation list at 50 clients: 3x the 96 requests/s
#: Open WebUI answered per web process on this kind of machine, and the p99.
TARGET_REQUESTS_PER_S_PER_PROCESS = 3 * 96
TARGET_P99_MS = 150


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of process ``pid`` so far, in seconds (Linux ``/proc``)."""
    # The fields after the command name (which may hold spaces) start with the state:
    # utime and stime are the 12th and 13th of them, in clock ticks.
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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
    port: int,
    token: str,
    clients: int,
    seconds: float,
    warmup: float,
    path: str = PATH,
    pids: tuple[int, ...] = (),
) -> dict:
    """Run the clients; the figures of the ``seconds`` after ``warmup`` (CPU of ``pids``)."""
    request = (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {token}\r\nAccept: application/json\r\n\r\n"
    ).encode()
    latencies: list[float] = []
    start = time.perf_counter()
    record_from, until = start + warmup, start + warmup + seconds

    async def cpu_at(moment: float) -> float:
        await asyncio.sleep(moment - time.perf_counter())
        return sum(cpu_seconds(pid) for pid in pids)

    cpu = asyncio.gather(cpu_at(record_from), cpu_at(until))
    errors = await asyncio.gather(
        *(
            one_connection(port, request, until, record_from, latencies, path == PATH)
            for _ in range(clients)
        )
    )
    cpu_from, cpu_until = await cpu
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
        "web_cpu_ms_per_request": round((cpu_until - cpu_from) * 1000 / len(latencies), 2),
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

    env = bench_env()
    migrate(env)
    token = bench_user_token(env, conversations=10)
    children, port = start_web(args.web_processes, env)
    with running(children):
        pids = tuple(child.pid for child in children)
        result = asyncio.run(
            load(port, token, args.clients, args.seconds, args.warmup, args.path, pids)
        )
    target_rps = TARGET_REQUESTS_PER_S_PER_PROCESS * args.web_processes
    result.update(
        path=args.path,
        clients=args.clients,
        seconds=args.seconds,
        web_processes=args.web_processes,
        cpus=os.cpu_count(),
        load_average=round(os.getloadavg()[0], 2),
        target={"requests_per_s": target_rps, "p99_ms": TARGET_P99_MS},
        met={
            "requests_per_s": result["requests_per_s"] >= target_rps,
            "p99_ms": result["p99_ms"] <= TARGET_P99_MS,
        },
    )
    print(json.dumps(result, indent=2))
    if result["errors"]:
        raise SystemExit(f"{result['errors']} answers were not a 200 with 10 items")


if __name__ == "__main__":
    main()
