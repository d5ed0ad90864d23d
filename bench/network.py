"""What the isolated sandbox network costs (issue 20): one model round and one SQL query,
from inside a bubblewrap jail, direct (``PAW_SANDBOX_NETWORK=host``) against through the
relay and the node's forwarder (``isolated``).

    PAW_DEBUG=1 .venv/bin/python bench/network.py [--rounds 300] [--postgres URL]

The "model" is a local HTTP server answering each POST with a 2 KB JSON body (the
transport of a model round, without the model's own time); PostgreSQL is a real server
(default: the development one, ``postgresql://postgres@127.0.0.1:5432/postgres``). Prints
medians and p90s in milliseconds: per request on a kept-alive connection (what the openai
SDK does across rounds), per new connection, per ``SELECT 1`` on an open connection, and
per PostgreSQL connect.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paw_project.settings")

import django

django.setup()

from sandboxes.launch import bwrap_prefix, datasource_variables, sandbox_dirs  # noqa: E402
from sandboxes.network import SandboxNetwork, network_plan, relay_prefix  # noqa: E402
from secrets_vault.services.sandbox import RunDatasource  # noqa: E402

CLIENT = r"""
import http.client, json, os, socket, statistics, sys, time
from urllib.parse import urlsplit
import psycopg
rounds = int(sys.argv[1])
base = urlsplit(os.environ["OPENAI_BASE_URL"])
body = json.dumps({"messages": [{"role": "user", "content": "x" * 500}]})
def stats(samples):
    samples = sorted(samples)
    return [round(statistics.median(samples) * 1000, 3), round(samples[int(len(samples) * 0.9)] * 1000, 3)]
def request(connection):
    if connection.sock is None:  # like httpx: no Nagle delay between head and body
        connection.connect()
        connection.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    connection.request("POST", base.path + "/chat/completions", body, {"Content-Type": "application/json"})
    connection.getresponse().read()
out = {}
connection = http.client.HTTPConnection(base.hostname, base.port)
request(connection)
samples = []
for _ in range(rounds):
    started = time.perf_counter(); request(connection); samples.append(time.perf_counter() - started)
out["model round, kept-alive"] = stats(samples)
samples = []
for _ in range(rounds // 3):
    started = time.perf_counter()
    fresh = http.client.HTTPConnection(base.hostname, base.port); request(fresh); fresh.close()
    samples.append(time.perf_counter() - started)
out["model round, new connection"] = stats(samples)
url = os.environ["PAW_DATASOURCE_BENCH_URL"]
with psycopg.connect(url) as db:
    db.execute("SELECT 1").fetchone()
    samples = []
    for _ in range(rounds):
        started = time.perf_counter(); db.execute("SELECT 1").fetchall(); samples.append(time.perf_counter() - started)
out["SQL query (SELECT 1)"] = stats(samples)
samples = []
for _ in range(rounds // 10):
    started = time.perf_counter(); psycopg.connect(url).close(); samples.append(time.perf_counter() - started)
out["PostgreSQL connect"] = stats(samples)
print(json.dumps(out))
"""

ANSWER = json.dumps({"choices": [{"message": {"content": "y" * 2000}}]}).encode()


class Model(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = 1 << 16  # head and body in one write (no Nagle wait)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)

    def log_message(self, *args: object) -> None:
        pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Model)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    datasources = (
        RunDatasource(
            slug="bench", name="bench", dialect="postgresql", description="",
            env_name="PAW_DATASOURCE_BENCH_URL", read_only=True,
        ),
    )  # fmt: skip
    env = {
        "PATH": os.environ["PATH"],
        "OPENAI_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}/v1",
        **datasource_variables(datasources),
        "PAW_DATASOURCE_BENCH_URL": args.postgres,
        "NO_PROXY": "127.0.0.1,localhost,::1",
    }
    workspace = Path(tempfile.mkdtemp(prefix="paw-bench-net-"))
    sandbox_dirs(workspace)
    results = {}
    for mode in ("host", "isolated"):
        run_env, prefix = dict(env), bwrap_prefix(workspace, env)
        network = None
        if mode == "isolated":
            plan = network_plan(env, datasources)
            run_env.update(plan.env)
            network = SandboxNetwork(plan, lambda destination, reason: print("refused", reason))
            prefix = [
                *bwrap_prefix(workspace, env, network_folder=network.start()),
                *relay_prefix(plan),
            ]
        try:
            done = subprocess.run(
                [*prefix, sys.executable, "-c", CLIENT, str(args.rounds)],
                env=run_env, capture_output=True, text=True, check=True, timeout=600,
            )  # fmt: skip
        finally:
            if network is not None:
                network.close()
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"{'ms (median / p90)':32} {'host':>18} {'isolated':>18} {'cost':>9}")
    for name in results["host"]:
        host, isolated = results["host"][name], results["isolated"][name]
        print(
            f"{name:32} {host[0]:8.3f} / {host[1]:7.3f} {isolated[0]:8.3f} / {isolated[1]:7.3f}"
            f" {isolated[0] - host[0]:+8.3f}"
        )


if __name__ == "__main__":
    main()
