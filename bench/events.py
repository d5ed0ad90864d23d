"""Benchmark: the event pipeline, from a sandbox's stdout to a websocket client.

    .venv/bin/python bench/events.py [--lines 20000] [--concurrent 100] [--quick]

Runs a real stack in Redis mode on loopback (``bench/stack.py``: PostgreSQL, Redis, one
web process, one Celery worker node) and real websocket clients (``websockets``), and
measures, each against the target of issue 4:

1. lines/s relayed exactly once from one sandbox to one websocket client (a runtime that
   writes ``--lines`` deltas as fast as it can);
2. runtime line → client latency at 100 lines/s (each line carries the time it was
   written; same clock);
3. warm run start: ``POST /runs`` → the run's ``start`` event on the socket, sandbox up;
4. cold run start: the same with a new conversation (the runtime process is spawned:
   ``paw-agent serve`` under bubblewrap, the default);
5. memory of an idle sandbox (``paw-agent``, resident set of its process tree);
6. ``--concurrent`` runs at once on one node, each streaming 100 lines/s for 5 s:
   latency percentiles, and that nothing is lost, doubled or reordered.

Measures 1, 2, 3 and 6 use the test suite's scripted runtime
(``tests/sandboxes/fake_runtime.py``, isolation ``none``) so they time PAW, not a model;
4 and 5 use the real ``paw-agent`` against the project's scripted model server.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import httpx
import websockets
from stack import (
    ROOT,
    bench_env,
    bench_user_token,
    manage_shell,
    migrate,
    percentile,
    start_web,
    start_worker,
    stop,
)

MEASURES = ["throughput", "latency", "warm", "concurrent", "cold", "memory"]
#: Seconds a concurrent-run client waits for its run's result before it counts as stalled.
STALL_SECONDS = 90
FAKE = f"{sys.executable} {ROOT / 'tests' / 'sandboxes' / 'fake_runtime.py'} serve"


class Stack:
    """The web process, the worker and a signed-in API client."""

    def __init__(self, env: dict[str, str], token: str, port: int) -> None:
        self.env = env
        self.token = token
        self.port = port
        self.http = httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )
        self.workspaces = Path(env["PAW_WORKSPACE_ROOT"])

    async def conversation(self, mode: str | None = None) -> str:
        response = await self.http.post("/api/conversations", json={"title": "bench"})
        response.raise_for_status()
        conversation_id = response.json()["id"]
        if mode:
            folder = self.workspaces / conversation_id
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "fake_mode").write_text(mode)
        return conversation_id

    async def start_run(self, conversation_id: str, prompt: str = "go") -> str:
        response = await self.http.post(
            f"/api/conversations/{conversation_id}/runs", json={"prompt": prompt}
        )
        if response.status_code != 202:
            raise SystemExit(f"run refused: {response.status_code} {response.text}")
        return response.json()["id"]

    def socket(self, conversation_id: str):
        return websockets.connect(
            f"ws://127.0.0.1:{self.port}/ws/conversations/{conversation_id}/?token={self.token}",
            origin="http://127.0.0.1",
            max_size=None,
            max_queue=None,
        )


async def until_result(ws, on_event=None) -> list[dict]:
    """Every ``run.event`` until the run's ``result`` (``on_event(event, received_at)``)."""
    events = []
    while True:
        message = json.loads(await ws.recv())
        if message["type"] != "run.event":
            continue
        received = time.time()
        events.append(message)
        if on_event:
            on_event(message, received)
        if message["event"]["type"] == "result":
            return events


def numbers_in_order(events: list[dict]) -> list[int]:
    text = "".join(e["event"]["text"] for e in events if e["event"]["type"] == "delta")
    return [int(word.split("@")[0]) for word in text.split()]


async def throughput(stack: Stack, lines: int) -> dict:
    conversation = await stack.conversation(f"flood {lines}")
    async with stack.socket(conversation) as ws:
        await ws.send(json.dumps({"type": "resume", "after": 0}))
        await stack.start_run(conversation)
        stamps: list[float] = []
        events = await until_result(
            ws, lambda e, t: stamps.append(t) if e["event"]["type"] == "delta" else None
        )
    numbers = numbers_in_order(events)
    seconds = stamps[-1] - stamps[0]
    return {
        "lines": lines,
        "lines_per_s": round((len(stamps) - 1) / seconds),
        "exactly_once_in_order": numbers == list(range(1, lines + 1)),
    }


async def latency(stack: Stack, lines: int = 500) -> dict:
    conversation = await stack.conversation(f"timed {lines} 0.01")
    delays: list[float] = []

    def measure(event: dict, received: float) -> None:
        if event["event"]["type"] == "delta":
            delays.append(received - float(event["event"]["text"].split("@")[1]))

    async with stack.socket(conversation) as ws:
        await ws.send(json.dumps({"type": "resume", "after": 0}))
        await stack.start_run(conversation)
        await until_result(ws, measure)
    delays = delays[20:]  # the first lines include the run's own start
    return {
        "rate_per_s": 100,
        "p50_ms": round(percentile(delays, 0.5) * 1000, 2),
        "p99_ms": round(percentile(delays, 0.99) * 1000, 2),
    }


async def run_start_time(stack: Stack, conversation: str) -> float:
    """Seconds from sending ``POST /runs`` to receiving the run's ``start`` event."""
    async with stack.socket(conversation) as ws:
        await ws.send(json.dumps({"type": "resume", "after": 10**12}))  # live only
        started = time.perf_counter()
        await stack.start_run(conversation)
        while True:
            message = json.loads(await ws.recv())
            if message["type"] == "run.event" and message["event"]["type"] == "start":
                elapsed = time.perf_counter() - started
                await until_result(ws)
                return elapsed


async def warm_start(stack: Stack, runs: int) -> dict:
    conversation = await stack.conversation("flood 1")
    await run_start_time(stack, conversation)  # spawns the sandbox
    times = [await run_start_time(stack, conversation) for _ in range(runs)]
    return {"runs": runs, "p50_ms": round(percentile(times, 0.5) * 1000, 1),
            "p90_ms": round(percentile(times, 0.9) * 1000, 1)}  # fmt: skip


async def cold_start(stack: Stack, runs: int) -> dict:
    times = [await run_start_time(stack, await stack.conversation()) for _ in range(runs)]
    return {"runs": runs, "p50_ms": round(percentile(times, 0.5) * 1000, 1),
            "p90_ms": round(percentile(times, 0.9) * 1000, 1)}  # fmt: skip


def idle_sandbox_memory(env: dict[str, str]) -> dict:
    """Resident memory of each live sandbox's process tree (MiB), after its runs."""
    script = (
        "from sandboxes.models import Sandbox\n"
        "print(list(Sandbox.objects.filter(state__in=Sandbox.LIVE_STATES).values_list('pid', flat=True)))\n"
    )
    pids = json.loads(manage_shell(script, env))
    sizes = [tree_rss(pid) / 1024 for pid in pids if pid]
    return {
        "sandboxes": len(sizes),
        "median_mb": round(percentile(sizes, 0.5), 1),
        "max_mb": round(max(sizes), 1),
    }


def tree_rss(pid: int) -> int:
    """KiB resident in ``pid`` and its descendants."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        if int(entry.name) == pid or _descends(int(entry.name), pid):
            total += int(fields.get("VmRSS", "0 kB").split()[0])
    return total


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        if pid == ancestor:
            return True
    return False


async def concurrent(stack: Stack, count: int, lines: int = 500) -> dict:
    conversations = [await stack.conversation(f"timed {lines} 0.01") for _ in range(count)]
    delays: list[float] = []
    complete = 0
    stalled: list[dict] = []

    async def follow(conversation: str, ready: asyncio.Event) -> None:
        nonlocal complete
        got: list[dict] = []

        def measure(event: dict, received: float) -> None:
            got.append(event)
            if event["event"]["type"] == "delta":
                delays.append(received - float(event["event"]["text"].split("@")[1]))

        async with stack.socket(conversation) as ws:
            await ws.send(json.dumps({"type": "resume", "after": 0}))
            ready.set()
            try:
                # The runs stream for 5 s; a client still waiting long after lost something.
                await asyncio.wait_for(until_result(ws, measure), timeout=STALL_SECONDS)
            except TimeoutError:
                stalled.append(
                    {"conversation": conversation, "events": len(got),
                     "last_cursor": got[-1]["cursor"] if got else 0}
                )  # fmt: skip
                return
        if numbers_in_order(got) == list(range(1, lines + 1)):
            complete += 1

    readies = [asyncio.Event() for _ in conversations]
    followers = [
        asyncio.create_task(follow(c, r)) for c, r in zip(conversations, readies, strict=True)
    ]
    await asyncio.gather(*(r.wait() for r in readies))
    await asyncio.gather(*(stack.start_run(c) for c in conversations))
    await asyncio.gather(*followers)
    return {
        "runs": count,
        "lines_each": lines,
        "rate_each_per_s": 100,
        "p50_ms": round(percentile(delays, 0.5) * 1000, 1),
        "p99_ms": round(percentile(delays, 0.99) * 1000, 1),
        "max_ms": round(max(delays) * 1000, 1),
        "runs_complete_exactly_once_in_order": complete,
        "stalled": stalled,
    }


async def fake_phase(env: dict[str, str], args: argparse.Namespace) -> dict:
    token = bench_user_token(env)
    web, port = start_web(1, env)
    try:
        worker = start_worker(env)
    except SystemExit:
        stop(web)
        raise
    stack = Stack(env, token, port)
    try:
        results = {}
        if "throughput" in args.only:
            results["throughput"] = await throughput(stack, args.lines)
        if "latency" in args.only:
            results["latency_at_100_lines_per_s"] = await latency(stack)
        if "warm" in args.only:
            results["warm_run_start"] = await warm_start(stack, 10 if args.quick else 30)
        if "concurrent" in args.only:
            results["concurrent"] = await concurrent(stack, 10 if args.quick else args.concurrent)
        return results
    finally:
        await stack.http.aclose()
        stop([worker, *web])


async def real_phase(env: dict[str, str], args: argparse.Namespace) -> dict:
    token = bench_user_token(env)
    web, port = start_web(1, env)
    try:
        worker = start_worker(env, node="bench-real")
    except SystemExit:
        stop(web)
        raise
    stack = Stack(env, token, port)
    try:
        results = {"cold_run_start": await cold_start(stack, 5 if args.quick else 10)}
        results["idle_sandbox_memory"] = idle_sandbox_memory(env)
        return results
    finally:
        await stack.http.aclose()
        stop([worker, *web])


# Issue 4's targets and the peer python-agent-web's numbers on this kind of machine.
TARGETS = [
    ("throughput", "lines/s relayed exactly once, one sandbox → one client", "≥ 20,000",
     "4,400/s, drops 38–86%"),
    ("latency_at_100_lines_per_s", "line → client latency at 100 lines/s", "p50 ≤ 1 ms, p99 ≤ 3 ms",
     "p50 0.9, p99 1.3 ms"),
    ("warm_run_start", "warm run start (POST → start event)", "≤ 10 ms", "13.5 ms"),
    ("cold_run_start", "cold run start (with the runtime process)", "≤ 150 ms", "192 ms"),
    ("idle_sandbox_memory", "memory per idle sandbox (after its runs)", "≤ 60 MB", "36 MB"),
    ("concurrent", "concurrent runs at 100 lines/s each, one node", "p99 ≤ 50 ms, nothing lost",
     "—"),
]  # fmt: skip


def verdicts(results: dict) -> dict[str, tuple[str, bool]]:
    """Each measure's headline number and whether it meets its target."""
    out: dict[str, tuple[str, bool]] = {}
    if r := results.get("throughput"):
        out["throughput"] = (
            f"{r['lines_per_s']:,}/s of {r['lines']:,} lines, exactly once: "
            f"{r['exactly_once_in_order']}",
            r["lines_per_s"] >= 20_000 and r["exactly_once_in_order"],
        )
    if r := results.get("latency_at_100_lines_per_s"):
        out["latency_at_100_lines_per_s"] = (
            f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms",
            r["p50_ms"] <= 1 and r["p99_ms"] <= 3,
        )
    if r := results.get("warm_run_start"):
        out["warm_run_start"] = (f"p50 {r['p50_ms']} ms, p90 {r['p90_ms']} ms", r["p50_ms"] <= 10)
    if r := results.get("cold_run_start"):
        out["cold_run_start"] = (f"p50 {r['p50_ms']} ms, p90 {r['p90_ms']} ms", r["p50_ms"] <= 150)
    if r := results.get("idle_sandbox_memory"):
        out["idle_sandbox_memory"] = (
            f"median {r['median_mb']} MB, max {r['max_mb']} MB",
            r["median_mb"] <= 60,
        )
    if r := results.get("concurrent"):
        whole = r["runs_complete_exactly_once_in_order"] == r["runs"]
        out["concurrent"] = (
            f"{r['runs']} runs: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
            f"{r['runs_complete_exactly_once_in_order']}/{r['runs']} complete",
            r["p99_ms"] <= 50 and whole,
        )
    return out


def report(results: dict) -> str:
    """A Markdown table: measure, target, the peer, this run, met or not."""
    rows = ["| measure | target | peer | PAW (this run) | met |", "|---|---|---|---|---|"]
    judged = verdicts(results)
    for key, label, target, peer in TARGETS:
        if key in judged:
            measured, met = judged[key]
            rows.append(f"| {label} | {target} | {peer} | {measured} | {'yes' if met else 'no'} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--concurrent", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument(
        "--only", nargs="+", choices=MEASURES, default=MEASURES, help="run only these measures"
    )
    args = parser.parse_args()

    from scripted_model import ScriptedModel

    with ScriptedModel({"fallback": "ok"}) as model:
        provider = {
            "PAW_LLM_BASE_URL": model.base_url,
            "PAW_LLM_API_KEY": "none",
            "PAW_LLM_MODEL": "scripted-model",
            "PAW_THROTTLE_RUNS": "100000/min",
        }
        fake_env = bench_env(
            PAW_HARNESS_CMD=FAKE,
            PAW_SANDBOX_ISOLATION="none",
            PAW_MAX_SANDBOXES_PER_NODE=str(max(args.concurrent + 10, 50)),
            **provider,
        )
        migrate(fake_env)
        results = {}
        if {"throughput", "latency", "warm", "concurrent"} & set(args.only):
            results.update(asyncio.run(fake_phase(fake_env, args)))
        if {"cold", "memory"} & set(args.only):
            results.update(asyncio.run(real_phase(bench_env(**provider), args)))
    results["cpus"] = os.cpu_count()
    results["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(results, indent=2))
    print()
    print(report(results))


if __name__ == "__main__":
    main()
