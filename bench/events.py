"""Benchmark: the event pipeline, from a sandbox's stdout to a websocket client.

    .venv/bin/python bench/events.py [--lines 20000] [--concurrent 100] [--quick]

Runs a real stack in Redis mode on loopback (``bench/stack.py``: PostgreSQL, Redis, one
web process, one Celery worker node) and real websocket clients (``websockets``), and
measures, each against the target of issue 16:

1. lines/s relayed exactly once from one sandbox to one websocket client (a runtime that
   writes ``--lines`` deltas as fast as it can);
2. runtime line → client latency at 100 lines/s (each line carries the time it was
   written; same clock);
3. warm run start: ``POST /runs`` → the run's ``start`` event on the socket, sandbox up;
4. cold run start: the same with a new conversation (the runtime process is spawned:
   ``paw-agent serve`` under bubblewrap, the default), and its first token (POST → the
   first ``delta``), then the first token of a warm conversation;
5. memory of an idle sandbox (``paw-agent``, resident set of its process tree);
6. ``--concurrent`` runs at once on one node, each streaming 100 lines/s for 5 s, their
   sandboxes started before (as ../shared/peer-bench does): latency percentiles (also per
   second of the streaming), and that nothing is lost, doubled or reordered; with
   ``--only concurrent-cold`` the runs spawn their runtimes themselves.

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
from runtime import tree_rss_mb, tree_uss_mb
from stack import (
    ROOT,
    bench_env,
    bench_user_token,
    free_port,
    manage_shell,
    migrate,
    percentile,
    start_web,
    start_worker,
    stop,
)

from paw_client.stream import frame_events

MEASURES = ["throughput", "latency", "warm", "concurrent", "concurrent-cold", "cold", "memory"]
#: Seconds a concurrent-run client waits for its run's result before it counts as stalled.
STALL_SECONDS = 90
FAKE = f"{sys.executable} {ROOT / 'tests' / 'sandboxes' / 'fake_runtime.py'} serve"


class Stack:
    """The web process, the worker and a signed-in API client."""

    def __init__(self, env: dict[str, str], token: str, port: int) -> None:
        self.env = env
        self.worker_metrics_port = int(env.get("PAW_WORKER_METRICS_PORT") or 0)
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
            f"ws://127.0.0.1:{self.port}/ws/conversations/{conversation_id}/"
            f"?token={self.token}&frames=batch",  # as the chat page reads it
            origin="http://127.0.0.1",
            max_size=None,
            max_queue=None,
        )


async def until_result(ws, on_event=None) -> list[dict]:
    """Every event until the run's ``result`` (``on_event(event, received_at)``)."""
    events = []
    while True:
        message = json.loads(await ws.recv())
        received = time.time()
        for event in frame_events(message):
            events.append(event)
            if on_event:
                on_event(event, received)
            if event["event"]["type"] == "result":
                return events


def word_delays(event: dict, received: float) -> list[float]:
    """Seconds from each timed word of a delta (``n@epoch``) being written to ``received``."""
    if event["event"]["type"] != "delta":
        return []
    return [received - float(word.split("@")[1]) for word in event["event"]["text"].split()]


#: The stack's metrics token: the web's /metrics and the worker's own endpoint.
METRICS_TOKEN = "paw-bench-metrics-token-0000"
RELAY_STAGES = {
    "read_to_send": "paw_relay_read_to_send_seconds",  # worker: line read → live
    "send_to_client": "paw_relay_send_to_client_seconds",  # web: live → websocket send
}


async def relay_buckets(stack: Stack) -> dict[str, dict[float, float]]:
    """The relay's two histograms now, as ``{stage: {upper bound (s): count}}``: the
    worker's (read → live) from its metrics endpoint, the web's (live → socket)."""
    from prometheus_client.parser import text_string_to_metric_families

    headers = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    texts = [
        (
            await stack.http.get(
                f"http://127.0.0.1:{stack.worker_metrics_port}/metrics", headers=headers
            )
        ).text,
        (await stack.http.get("/metrics", headers=headers)).text,
    ]
    found: dict[str, dict[float, float]] = {stage: {} for stage in RELAY_STAGES}
    for text in texts:
        for family in text_string_to_metric_families(text):
            for stage, name in RELAY_STAGES.items():
                if family.name != name:
                    continue
                for sample in family.samples:
                    if sample.name == name + "_bucket":
                        bound = float(sample.labels["le"])
                        found[stage][bound] = found[stage].get(bound, 0) + sample.value
    return found


def bucket_quantiles(before: dict[float, float], after: dict[float, float]) -> dict[str, str]:
    """p50 and p99 of what a histogram counted between two scrapes, as ``"≤ bound ms"``
    (a histogram knows its buckets, not the values)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0) for b in bounds]  # cumulative
    total = counts[-1] if counts else 0
    out = {"count": int(total)}
    for label, q in (("p50", 0.5), ("p99", 0.99)):
        bound = next((b for b, c in zip(bounds, counts, strict=True) if c >= q * total), None)
        out[label] = (
            "—" if not total else ("> 30 s" if bound == float("inf") else f"≤ {bound * 1000:g} ms")
        )
    return out


def numbers_in_order(events: list[dict]) -> list[int]:
    text = "".join(e["event"]["text"] for e in events if e["event"]["type"] == "delta")
    return [int(word.split("@")[0]) for word in text.split()]


async def throughput(stack: Stack, lines: int) -> dict:
    conversation = await stack.conversation(f"flood {lines}")
    async with stack.socket(conversation) as ws:
        await ws.send(json.dumps({"type": "resume", "after": 0}))
        await stack.start_run(conversation)
        stamps: list[float] = []  # when the start and each delta arrived

        def count(event: dict, received: float) -> None:
            if event["event"]["type"] in ("start", "delta"):
                stamps.append(received)

        events = await until_result(ws, count)
    numbers = numbers_in_order(events)
    seconds = stamps[-1] - stamps[0]  # from the run's start to its last word at the client
    return {
        "lines": lines,
        "lines_per_s": round(len(numbers) / seconds) if seconds > 0 else None,
        "delta_events": len(stamps) - 1,
        "exactly_once_in_order": numbers == list(range(1, lines + 1)),
    }


async def latency(stack: Stack, lines: int = 500) -> dict:
    conversation = await stack.conversation(f"timed {lines} 0.01")
    delays: list[float] = []

    def measure(event: dict, received: float) -> None:
        delays.extend(word_delays(event, received))

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


async def run_times(stack: Stack, conversation: str) -> tuple[float, float | None]:
    """Seconds from sending ``POST /runs`` to receiving the run's ``start`` event, and to
    its first ``delta`` (``None`` if it streamed none)."""
    # From the conversation's cursor: a resume "from now" can reach the server after the
    # POST, and then misses the run's first events.
    after = (await stack.http.get(f"/api/conversations/{conversation}")).json()["event_cursor"]
    async with stack.socket(conversation) as ws:
        await ws.send(json.dumps({"type": "resume", "after": after}))
        started = time.perf_counter()
        run_id = await stack.start_run(conversation)
        start = first = None
        while True:
            for message in frame_events(json.loads(await ws.recv())):
                if message["run_id"] != run_id:
                    continue
                kind = message["event"]["type"]
                if kind == "start" and start is None:
                    start = time.perf_counter() - started
                elif kind == "delta" and first is None:
                    first = time.perf_counter() - started
                elif kind == "result":
                    return start or 0.0, first


async def run_start_time(stack: Stack, conversation: str) -> float:
    """Seconds from sending ``POST /runs`` to receiving the run's ``start`` event."""
    return (await run_times(stack, conversation))[0]


async def warm_start(stack: Stack, runs: int) -> dict:
    conversation = await stack.conversation("flood 1")
    await run_start_time(stack, conversation)  # spawns the sandbox
    times = [await run_start_time(stack, conversation) for _ in range(runs)]
    return {"runs": runs, "p50_ms": round(percentile(times, 0.5) * 1000, 1),
            "p90_ms": round(percentile(times, 0.9) * 1000, 1)}  # fmt: skip


#: Seconds between two new conversations of the cold measure: a person's pace, long enough
#: for the node to have its spare runtime ready again (PAW_SANDBOX_SPARES, about 0.5 s).
COLD_GAP = 2.0


async def cold_start(stack: Stack, runs: int) -> dict:
    """New conversations (their runtime is a spare handed over, else spawned): POST →
    ``start`` and POST → first ``delta``, one every ``COLD_GAP`` seconds; the same for
    ``runs`` new conversations back to back (a burst: the node's spares run out); then
    ``runs`` more runs in the last one (warm: POST → first delta), after a pause."""
    cold = []
    for _ in range(runs):
        await asyncio.sleep(COLD_GAP)
        cold.append(await run_times(stack, await stack.conversation()))
    burst = [(await run_times(stack, await stack.conversation()))[1] for _ in range(runs)]
    conversation = await stack.conversation()
    await run_times(stack, conversation)
    await asyncio.sleep(COLD_GAP)  # the refill after the last hand-over is done
    warm = [(await run_times(stack, conversation))[1] for _ in range(runs)]
    starts = [start for start, _ in cold]
    firsts = [first for _, first in cold if first is not None]
    burst = [first for first in burst if first is not None]
    warm = [first for first in warm if first is not None]
    ms = lambda values, q: round(percentile(values, q) * 1000, 1)  # noqa: E731
    return {
        "runs": runs,
        "p50_ms": ms(starts, 0.5),
        "p90_ms": ms(starts, 0.9),
        "first_token_p50_ms": ms(firsts, 0.5),
        "first_token_p90_ms": ms(firsts, 0.9),
        "burst_first_token_p50_ms": ms(burst, 0.5),
        "burst_first_token_p90_ms": ms(burst, 0.9),
        "warm_first_token_p50_ms": ms(warm, 0.5),
        "warm_first_token_p90_ms": ms(warm, 0.9),
    }


def idle_sandbox_memory(env: dict[str, str]) -> dict:
    """Memory of each live sandbox's process tree (MiB), after its runs: resident (shared
    library pages counted in full) and private (what one more sandbox really adds)."""
    script = (
        "from sandboxes.models import Sandbox\n"
        "print(list(Sandbox.objects.filter(state__in=Sandbox.LIVE_STATES).values_list('pid', flat=True)))\n"
    )
    pids = [pid for pid in json.loads(manage_shell(script, env)) if pid]
    sizes = [tree_rss_mb(pid) for pid in pids]
    private = [tree_uss_mb(pid) for pid in pids]
    return {
        "sandboxes": len(sizes),
        "median_mb": round(percentile(sizes, 0.5), 1),
        "max_mb": round(max(sizes), 1),
        "private_median_mb": round(percentile(private, 0.5), 1),
    }


async def concurrent(stack: Stack, count: int, lines: int = 500, *, cold: bool = False) -> dict:
    """``count`` runs streaming ``lines`` words at 100/s each, all started at once. As
    ../shared/peer-bench does, each conversation's sandbox is started first by a run of
    one word (ten at a time), unless ``cold``: then the 100 runs also spawn their 100
    runtimes while the first ones stream."""
    conversations = [await stack.conversation("flood 1" if not cold else f"timed {lines} 0.01")
                     for _ in range(count)]  # fmt: skip
    if not cold:
        gate = asyncio.Semaphore(10)

        async def warm(conversation: str) -> None:
            async with gate:
                await run_start_time(stack, conversation)
            (stack.workspaces / conversation / "fake_mode").write_text(f"timed {lines} 0.01")

        await asyncio.gather(*(warm(c) for c in conversations))
    delays: list[float] = []
    stamped: list[tuple[float, float]] = []  # (when a word was written, its delay)
    complete = 0
    stalled: list[dict] = []

    async def follow(conversation: str, ready: asyncio.Event) -> None:
        nonlocal complete
        got: list[dict] = []

        def measure(event: dict, received: float) -> None:
            got.append(event)
            for delay in word_delays(event, received):
                delays.append(delay)
                stamped.append((received - delay, delay))

        # From the conversation's cursor now: not the warm-up run's events.
        response = await stack.http.get(f"/api/conversations/{conversation}")
        after = response.json()["event_cursor"]
        async with stack.socket(conversation) as ws:
            await ws.send(json.dumps({"type": "resume", "after": after}))
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

    relay_before = await relay_buckets(stack)
    readies = [asyncio.Event() for _ in conversations]
    followers = [
        asyncio.create_task(follow(c, r)) for c, r in zip(conversations, readies, strict=True)
    ]
    await asyncio.gather(*(r.wait() for r in readies))
    await asyncio.gather(*(stack.start_run(c) for c in conversations))
    await asyncio.gather(*followers)
    relay_after = await relay_buckets(stack)
    # p99 per second of the streaming, from the first word written: where the delay comes.
    start = min(written for written, _ in stamped)
    by_second: dict[int, list[float]] = {}
    for written, delay in stamped:
        by_second.setdefault(int(written - start), []).append(delay)
    return {
        "runs": count,
        "sandboxes": "spawned by the runs" if cold else "started before (a run of one word each)",
        "lines_each": lines,
        "rate_each_per_s": 100,
        "p50_ms": round(percentile(delays, 0.5) * 1000, 1),
        "p99_ms": round(percentile(delays, 0.99) * 1000, 1),
        "max_ms": round(max(delays) * 1000, 1),
        "p99_ms_by_second": {
            second: round(percentile(values, 0.99) * 1000, 1)
            for second, values in sorted(by_second.items())
        },
        "runs_complete_exactly_once_in_order": complete,
        "stalled": stalled,
        # Where the words' delay goes, from PAW's own histograms (bucket bounds): on the
        # worker from a line read to its live append, on the web from there to the socket.
        "relay_stages": {
            stage: bucket_quantiles(relay_before[stage], relay_after[stage])
            for stage in RELAY_STAGES
        },
    }


async def fake_phase(env: dict[str, str], args: argparse.Namespace) -> dict:
    token = bench_user_token(env)
    web, port = start_web(args.web_processes, env)
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
        if "concurrent-cold" in args.only:
            results["concurrent_cold"] = await concurrent(
                stack, 10 if args.quick else args.concurrent, cold=True
            )
        return results
    finally:
        await stack.http.aclose()
        stop([worker, *web])


async def real_phase(env: dict[str, str], args: argparse.Namespace) -> dict:
    token = bench_user_token(env)
    web, port = start_web(args.web_processes, env)
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


# Issue 16's targets; the peer is Open WebUI, as issue 16 measured it with ../shared/peer-bench
# on this kind of machine (2 cores, the same fake model); "lines" are words of one line each.
TARGETS = [
    ("throughput", "words/s relayed exactly once, one stream → one client", "≥ 19,570 (5× peer)",
     "3,914/s"),
    ("latency_at_100_lines_per_s", "word → client latency, one stream at 100 words/s",
     "p50 ≤ 1.2 ms, p99 ≤ 3 ms", "p50 1.2, p99 3.0 ms"),
    ("warm_run_start", "warm run start (POST → start event)", "≤ 10 ms", "—"),
    ("cold_run_start", "cold run start (with the runtime process)", "≤ 150 ms", "—"),
    ("first_token_new", "first token, new conversation (POST → first delta)", "≤ 300 ms",
     "260 ms"),
    ("first_token_burst", "first token, new conversations back to back", "—", "—"),
    ("first_token_warm", "first token, warm conversation", "≤ 50 ms", "—"),
    ("idle_sandbox_memory", "memory per idle sandbox (its process tree, after its runs)",
     "≤ 40 MB private", "—"),
    ("concurrent", "100 streams at 100 words/s each, one node", "p99 ≤ 100 ms, nothing lost",
     "p50 13.8 s, p99 25.6 s"),
    ("concurrent_cold", "the same, the 100 runtimes spawned by the runs", "p99 ≤ 100 ms", "—"),
]  # fmt: skip


def verdicts(results: dict) -> dict[str, tuple[str, bool | None]]:
    """Each measure's headline number and whether it meets its target (None: it has none)."""
    out: dict[str, tuple[str, bool | None]] = {}
    if r := results.get("throughput"):
        out["throughput"] = (
            f"{r['lines_per_s']:,}/s of {r['lines']:,} lines, exactly once: "
            f"{r['exactly_once_in_order']}",
            (r["lines_per_s"] or 0) >= 19_570 and r["exactly_once_in_order"],
        )
    if r := results.get("latency_at_100_lines_per_s"):
        out["latency_at_100_lines_per_s"] = (
            f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms",
            r["p50_ms"] <= 1.2 and r["p99_ms"] <= 3,
        )
    if r := results.get("warm_run_start"):
        out["warm_run_start"] = (f"p50 {r['p50_ms']} ms, p90 {r['p90_ms']} ms", r["p50_ms"] <= 10)
    if r := results.get("cold_run_start"):
        out["cold_run_start"] = (f"p50 {r['p50_ms']} ms, p90 {r['p90_ms']} ms", r["p50_ms"] <= 150)
        out["first_token_new"] = (
            f"p50 {r['first_token_p50_ms']} ms, p90 {r['first_token_p90_ms']} ms",
            r["first_token_p50_ms"] <= 300,
        )
        out["first_token_burst"] = (
            f"p50 {r['burst_first_token_p50_ms']} ms, p90 {r['burst_first_token_p90_ms']} ms",
            None,  # no target: what a burst costs once the spares run out
        )
        out["first_token_warm"] = (
            f"p50 {r['warm_first_token_p50_ms']} ms, p90 {r['warm_first_token_p90_ms']} ms",
            r["warm_first_token_p50_ms"] <= 50,
        )
    if r := results.get("idle_sandbox_memory"):
        out["idle_sandbox_memory"] = (
            f"private median {r['private_median_mb']} MB (resident {r['median_mb']} MB)",
            r["private_median_mb"] <= 40,
        )
    for key in ("concurrent", "concurrent_cold"):
        if r := results.get(key):
            whole = r["runs_complete_exactly_once_in_order"] == r["runs"]
            out[key] = (
                f"{r['runs']} runs: p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
                f"{r['runs_complete_exactly_once_in_order']}/{r['runs']} complete",
                r["p99_ms"] <= 100 and whole,
            )
    return out


def report(results: dict) -> str:
    """A Markdown table: measure, target, the peer, this run, met or not."""
    rows = ["| measure | target | peer | PAW (this run) | met |", "|---|---|---|---|---|"]
    judged = verdicts(results)
    for key, label, target, peer in TARGETS:
        if key in judged:
            measured, met = judged[key]
            verdict = "—" if met is None else "yes" if met else "no"
            rows.append(f"| {label} | {target} | {peer} | {measured} | {verdict} |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=20000)
    parser.add_argument("--concurrent", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument(
        "--web-processes", type=int, default=1, help="web processes sharing the port (default 1)"
    )
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
            PAW_METRICS_TOKEN=METRICS_TOKEN,
            PAW_WORKER_METRICS_PORT=str(free_port()),
            PAW_HARNESS_CMD=FAKE,
            PAW_ALLOW_UNGATED_RUNTIME="1",  # the fake runtime asks before nothing
            PAW_SANDBOX_ISOLATION="none",
            PAW_MAX_SANDBOXES_PER_NODE=str(max(args.concurrent + 10, 50)),
            **provider,
        )
        migrate(fake_env)
        results = {}
        if {"throughput", "latency", "warm", "concurrent", "concurrent-cold"} & set(args.only):
            results.update(asyncio.run(fake_phase(fake_env, args)))
        if {"cold", "memory"} & set(args.only):
            results.update(asyncio.run(real_phase(bench_env(**provider), args)))
    results["cpus"] = os.cpu_count()
    results["web_processes"] = args.web_processes
    results["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(results, indent=2))
    print()
    print(report(results))


if __name__ == "__main__":
    main()
