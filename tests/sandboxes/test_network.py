"""A sandbox reaches only what its run needs (``PAW_SANDBOX_NETWORK=isolated``, the default
under bubblewrap): its model endpoint and its datasources, through the node's forwarder;
PAW's own Redis and PostgreSQL, another loopback address, another sandbox and link-local
or metadata addresses are refused quickly, with a message naming the reason."""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from urllib.parse import urlsplit

import pytest
from django.conf import settings
from django.test import override_settings

from conversations.models import Run, RunEvent
from sandboxes.launch import network_mode
from sandboxes.network import (
    NetworkPlan,
    NetworkPolicy,
    SandboxNetwork,
    destination_refusal,
    network_plan,
)
from secrets_vault.services import RunDatasource
from tests.conftest import HARNESS, PAW_AGENT, SCRIPTED_API_KEY
from tests.factories import ConversationFactory, datasource_made
from tests.pgdatasource import pg_datasource_settings
from tests.processes import database_settings
from tests.sandboxes.conftest import require_bubblewrap
from tests.sandboxes.test_run_options import run_to_end, sandbox_command

NOT_ALLOWED = "not allowed for this run"


def run_datasource(
    slug: str, dialect: str, env_name: str, *, allowed_hosts: tuple[str, ...] = ()
) -> RunDatasource:
    """A run's datasource as the sandbox spec carries it."""
    return RunDatasource(
        slug=slug, name=slug, dialect=dialect, description="", env_name=env_name,
        read_only=True, allowed_hosts=allowed_hosts,
    )  # fmt: skip


# --- the policy, a pure function --------------------------------------------------------


def test_link_local_and_metadata_addresses_are_refused_whatever_is_allowed():
    everything = NetworkPolicy(
        allowed=frozenset({("169.254.169.254", 80), ("meta.example", 80)}),
        patterns=("169.254.169.254", "*.example", "fd00:ec2::254", "metadata.google.internal"),
    )
    for host, addresses in [
        ("169.254.169.254", []),
        ("169.254.10.1", []),
        ("fd00:ec2::254", []),
        ("fe80::1", []),
        ("[fd00:ec2::254]", []),
        ("::ffff:169.254.169.254", []),
        ("100.100.100.200", []),
        ("metadata.google.internal", ["10.0.0.5"]),
        ("meta.example", ["169.254.169.254"]),  # a name resolving to the metadata address
        ("meta.example", ["93.184.216.34", "fe80::2"]),  # any of its addresses
    ]:
        reason = destination_refusal(host, 80, addresses, everything)
        assert reason is not None and "never allowed" in reason, (host, addresses, reason)
    # The unspecified addresses ("this host") are refused as what they are.
    for host in ("0.0.0.0", "::", "[::]", "0.1.2.3", "::ffff:0.0.0.0"):  # noqa: S104
        reason = destination_refusal(host, 6379, [], NetworkPolicy(patterns=(host,)))
        assert reason is not None and "unspecified address" in reason, (host, reason)


def test_the_policy_allows_the_runs_destinations_and_operator_patterns_only():
    policy = NetworkPolicy(
        allowed=frozenset({("api.model.test", 443), ("db.internal", 5432)}),
        datasources=frozenset({("db.internal", 5432)}),
        patterns=("pypi.org:443", "*.corp.test", "files.test:8080"),
        paw_services=frozenset({("127.0.0.1", 5432), ("127.0.0.1", 6379), ("10.1.1.1", 5432)}),
    )
    assert destination_refusal("api.model.test", 443, ["8.8.8.8"], policy) is None
    assert destination_refusal("API.Model.Test.", 443, ["8.8.8.8"], policy) is None
    assert NOT_ALLOWED in destination_refusal("api.model.test", 80, ["8.8.8.8"], policy)
    assert destination_refusal("pypi.org", 443, ["1.1.1.1"], policy) is None
    assert NOT_ALLOWED in destination_refusal("pypi.org", 80, ["1.1.1.1"], policy)
    assert destination_refusal("git.corp.test", 22, ["10.2.2.2"], policy) is None
    assert destination_refusal("files.test", 8080, ["10.2.2.3"], policy) is None
    assert NOT_ALLOWED in destination_refusal("elsewhere.test", 443, ["10.2.2.4"], policy)
    # PAW's own services, by name or by address, unless the run's datasource is that one.
    assert "PAW's own" in destination_refusal("127.0.0.1", 6379, [], policy)
    assert "PAW's own" in destination_refusal("paw-db.test", 5432, ["10.1.1.1"], policy)
    assert destination_refusal("db.internal", 5432, ["10.1.1.1"], policy) is None
    assert "not a valid" in destination_refusal("api.model.test", 0, [], policy)
    # The package index only while an approved install runs.
    indexed = NetworkPolicy(package_index=frozenset({("pypi.org", 443)}))
    assert NOT_ALLOWED in destination_refusal("pypi.org", 443, ["1.1.1.1"], indexed)
    assert destination_refusal("pypi.org", 443, ["1.1.1.1"], indexed, index_open=True) is None
    assert "never allowed" in destination_refusal(
        "pypi.org", 443, ["169.254.169.254"], indexed, index_open=True
    )


def test_the_plan_rewrites_datasource_urls_and_plain_http_endpoints_to_the_relay():
    env = {
        "OPENAI_BASE_URL": "https://api.model.test/v1",
        "PAW_EMBEDDING_BASE_URL": "http://10.0.0.9:8080/v1",
        "PAW_DATASOURCE_PG_URL": "postgresql://u:p%40ss@db.internal:6543/shop?sslmode=verify-full",
        "PAW_DATASOURCE_MY_URL": "mysql://root:pw@maria.internal/shop?ssl_ca=/x.pem",
        "PAW_DATASOURCE_LITE_URL": "sqlite:////data/x.sqlite3?mode=ro",
    }
    datasources = (
        run_datasource("pg", "postgresql", "PAW_DATASOURCE_PG_URL"),
        run_datasource("my", "mysql", "PAW_DATASOURCE_MY_URL"),
        run_datasource("lite", "sqlite", "PAW_DATASOURCE_LITE_URL"),
    )
    plan = network_plan(env, datasources)
    assert "OPENAI_BASE_URL" not in plan.env  # unchanged: reached through the proxy
    assert plan.env["HTTPS_PROXY"] == plan.env["https_proxy"] == "http://127.0.0.1:3128"
    forwards = {(f.host, f.port): f.local_port for f in plan.forwards}
    assert set(forwards) == {("10.0.0.9", 8080), ("db.internal", 6543), ("maria.internal", 3306)}
    assert plan.env["PAW_EMBEDDING_BASE_URL"] == (
        f"http://127.0.0.1:{forwards[('10.0.0.9', 8080)]}/v1"
    )
    pg = urlsplit(plan.env["PAW_DATASOURCE_PG_URL"])
    assert (pg.hostname, pg.port, pg.password) == (
        "db.internal",
        forwards[("db.internal", 6543)],
        "p%40ss",
    )
    assert "sslmode=verify-full" in pg.query and "hostaddr=127.0.0.1" in pg.query
    assert plan.env["PAW_DATASOURCE_MY_URL"] == (
        f"mysql://root:pw@127.0.0.1:{forwards[('maria.internal', 3306)]}/shop?ssl_ca=/x.pem"
    )
    assert "PAW_DATASOURCE_LITE_URL" not in plan.env
    assert plan.policy.allowed == {
        ("api.model.test", 443), ("10.0.0.9", 8080), ("db.internal", 6543), ("maria.internal", 3306)
    }  # fmt: skip
    assert plan.policy.datasources == {("db.internal", 6543), ("maria.internal", 3306)}


def test_network_mode_isolated_by_default_under_bubblewrap_host_without_it():
    require_bubblewrap()
    with override_settings(PAW_SANDBOX_ISOLATION="bwrap", PAW_SANDBOX_NETWORK=""):
        assert network_mode() == "isolated"
    with override_settings(PAW_SANDBOX_ISOLATION="bwrap", PAW_SANDBOX_NETWORK="host"):
        assert network_mode() == "host"
    with override_settings(PAW_SANDBOX_ISOLATION="none", PAW_SANDBOX_NETWORK="isolated"):
        assert network_mode() == "host"  # no jail, no namespace: said in the log


# --- the node-side forwarder, against listeners the test starts -------------------------


class Listener:
    """A TCP listener on ``host`` (a free port) that counts connections and answers
    ``hello``."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_server((host, 0))
        self.host, self.port = host, self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with conn:
                conn.sendall(b"hello")

    def close(self) -> None:
        self.sock.close()


def _through(folder, preface: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(5)
        sock.connect(str(folder / "forward.sock"))
        sock.sendall(preface)
        sock.shutdown(socket.SHUT_WR)  # all the client has to say
        data = b""
        while chunk := sock.recv(4096):
            data += chunk
        return data


def test_the_forwarder_refuses_metadata_addresses_even_when_allowed_and_reaches_the_allowed(
    caplog,
):
    listener = Listener()
    refused: list[tuple[str, str]] = []
    plan = NetworkPlan(
        policy=NetworkPolicy(
            allowed=frozenset({("127.0.0.1", listener.port), ("169.254.169.254", listener.port)}),
            patterns=(f"169.254.169.254:{listener.port}", "fd00:ec2::254"),
        )
    )
    network = SandboxNetwork(
        plan, lambda destination, reason: refused.append((destination, reason))
    )
    folder = network.start()
    try:
        started = time.monotonic()
        answer = _through(
            folder, f"PROXY\nCONNECT 169.254.169.254:{listener.port} HTTP/1.1\r\n\r\n".encode()
        )
        assert answer.startswith(b"HTTP/1.1 403 Forbidden by PAW: 169.254.169.254"), answer
        assert b"never allowed" in answer
        answer = _through(folder, f"TCP fd00:ec2::254 {listener.port}\n".encode())
        assert answer.startswith(b"paw: fd00:ec2::254") and b"never allowed" in answer
        assert time.monotonic() - started < 2
        assert _through(folder, f"TCP 127.0.0.1 {listener.port}\n".encode()) == b"hello"
        answer = _through(
            folder, f"PROXY\nCONNECT 127.0.0.1:{listener.port} HTTP/1.1\r\n\r\n".encode()
        )
        assert answer == b"HTTP/1.1 200 Connection established\r\n\r\nhello"
        assert listener.accepted == 2  # only the allowed ones ever reached it
        # A client gone in the middle of its request head: closed quietly, no traceback.
        assert _through(folder, b"PROXY\nCONNECT 127.0.0.1:") == b""
        time.sleep(0.2)  # the refusal callback runs on a helper thread
        assert [destination for destination, _ in refused] == [
            f"169.254.169.254:{listener.port}",
            f"fd00:ec2::254:{listener.port}",
        ]
        # One spelling per port: "+8410" or "08410" is no destination.
        for port in (f"+{listener.port}", f"0{listener.port}"):
            answer = _through(folder, f"PROXY\nCONNECT 127.0.0.1:{port} HTTP/1.1\r\n\r\n".encode())
            assert answer.startswith(b"HTTP/1.1 403 Forbidden by PAW:"), (port, answer)
            assert b"not a valid destination" in answer
        assert listener.accepted == 2
    finally:
        network.close()
        listener.close()
    assert not folder.exists()
    assert "a connection failed" not in caplog.text


# --- real sandboxes (bubblewrap, the worker, the scripted model) ----------------------

PROBE = """
import http.client, json, os, socket, time, urllib.request
out = {}
def timed(name, attempt):
    started = time.monotonic()
    try:
        out[name] = ["reached", str(attempt())[:200]]
    except Exception as exc:
        out[name] = [type(exc).__name__, str(exc)]
    out[name].append(round(time.monotonic() - started, 3))
for name in ("NO_PROXY", "no_proxy"):  # loopback too through PAW's proxy
    os.environ.pop(name, None)
proxied = urllib.request.build_opener(urllib.request.ProxyHandler({"http": os.environ["HTTP_PROXY"]}))
def tunnel(host, port):
    connection = http.client.HTTPConnection("127.0.0.1", 3128, timeout=5)
    connection.set_tunnel(host, port)
    connection.connect()
    return "tunnel open"
for name, (host, port) in TARGETS.items():
    timed(name + " socket", lambda: socket.create_connection((host, port), timeout=5).recv(5))
    timed(name + " http", lambda: proxied.open(f"http://{host}:{port}/", timeout=5).read())
    timed(name + " connect", lambda: tunnel(host, port))
print(json.dumps(out))
"""


def _scripted_tool_output(scripted_model, prompt: str) -> str:
    for body in reversed(scripted_model.requests):
        if any(m.get("content") == prompt for m in body.get("messages", [])):
            tools = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
            if tools:
                return tools[-1]
    raise AssertionError(f"no tool output for {prompt!r}")


def _probe_results(scripted_model, prompt: str) -> dict:
    """The JSON object :data:`PROBE` printed in the run of ``prompt``."""
    output = _scripted_tool_output(scripted_model, prompt)
    return json.loads(output[output.index("{") : output.rindex("}") + 1])


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_run_python_cannot_reach_paws_redis_postgresql_or_another_loopback_address(
    worker_node, scripted_model
):
    require_bubblewrap()
    worker_node.use(PAW_AGENT, PAW_SANDBOX_ISOLATION="bwrap")
    redis = urlsplit(settings.REDIS_URL)
    database = database_settings()
    other = Listener("127.0.0.2")
    targets = {
        "redis": [redis.hostname, redis.port or 6379],
        "postgresql": [database["host"], database["port"]],
        "listener": [other.host, other.port],
    }
    prompt = "Probe the network."
    code = f"TARGETS = {json.dumps(targets)}\n{PROBE}"
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "rules": [
                {
                    "match": re.escape(prompt),
                    "responses": [
                        {"tool_calls": [{"name": "run_python", "arguments": {"code": code}}]},
                        {"text": "Probed."},
                    ],
                }
            ],
        }
    )
    conversation = ConversationFactory()
    run = run_to_end(conversation, prompt)
    assert run.status == Run.Status.DONE, run.errors  # the model endpoint is reachable
    assert "--unshare-net" in sandbox_command(conversation)
    results = _probe_results(scripted_model, prompt)
    assert set(results) == {f"{t} {way}" for t in targets for way in ("socket", "http", "connect")}
    for name, (outcome, message, seconds) in results.items():
        assert outcome != "reached", (name, message)
        assert seconds < 2, (name, seconds)  # refused at once, not after a timeout
        if not name.endswith("socket"):  # through the proxy: PAW says why
            assert NOT_ALLOWED in message, (name, message)
    assert "PAW's own" in results["redis connect"][1]
    assert "PAW's own" in results["postgresql http"][1]
    assert other.accepted == 0
    other.close()
    notices = RunEvent.objects.filter(run_id=run.id, type="notice", kind="network_refused")
    assert notices.count() == 1  # once per run, though six attempts were refused
    assert NOT_ALLOWED in notices.get().payload["message"]
    log = worker_node.output()
    assert f"run {run.id}: network destination refused" in log
    assert f"{other.host}:{other.port} is not allowed for this run" in log


LISTEN = """
import socket, threading
if "server" not in globals():
    server = socket.create_server(("127.0.0.1", PORT))
    def serve():
        while True:
            conn, _ = server.accept()
            conn.sendall(b"mine")
            conn.close()
    threading.Thread(target=serve, daemon=True).start()
print("own listener answers:", socket.create_connection(("127.0.0.1", PORT), timeout=3).recv(4))
"""

REACH = """
import socket, time
started = time.monotonic()
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=3).recv(4)
    print("reached the other sandbox")
except OSError as exc:
    print("refused:", type(exc).__name__, round(time.monotonic() - started, 3))
"""


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_two_sandboxes_cannot_reach_each_other(worker_node, scripted_model):
    require_bubblewrap()
    worker_node.use(PAW_AGENT, PAW_SANDBOX_ISOLATION="bwrap")
    port = 47321

    def step(prompt: str, code: str) -> dict:
        return {
            "match": re.escape(prompt),
            "responses": [
                {"tool_calls": [{"name": "run_python", "arguments": {"code": code}}]},
                {"text": "Done."},
            ],
        }

    listen, reach = LISTEN.replace("PORT", str(port)), REACH.replace("PORT", str(port))
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "rules": [
                step("Listen.", listen),
                step("Listen again.", listen),
                step("Reach.", reach),
            ],
        }
    )
    first, second = ConversationFactory(), ConversationFactory()
    assert run_to_end(first, "Listen.").status == Run.Status.DONE
    assert "own listener answers: b'mine'" in _scripted_tool_output(scripted_model, "Listen.")
    assert run_to_end(second, "Reach.").status == Run.Status.DONE
    reached = _scripted_tool_output(scripted_model, "Reach.")
    assert "refused: ConnectionRefusedError" in reached, reached
    assert float(reached.rsplit(" ", 1)[-1].strip(" \n'\"")) < 2
    # The first sandbox's listener was up all along.
    assert run_to_end(first, "Listen again.").status == Run.Status.DONE
    assert "own listener answers: b'mine'" in _scripted_tool_output(scripted_model, "Listen again.")


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_postgresql_and_mariadb_datasources_work_through_the_forwarder(
    worker_node, scripted_model, mariadb
):
    require_bubblewrap()
    worker_node.use(PAW_AGENT, PAW_SANDBOX_ISOLATION="bwrap")
    # A database on PAW's own PostgreSQL server (never PAW's database itself): the server's
    # address, registered as a datasource of the run, is allowed.
    datasource_made(
        slug="net_pg", name="PG", dialect="postgresql", description="PAW's server",
        connection=pg_datasource_settings(),
    )  # fmt: skip
    datasource_made(
        slug="net_maria", name="Maria", dialect="mysql", description="MariaDB",
        connection={k: v for k, v in mariadb.items() if k in ("host", "port", "database", "user")},
    )  # fmt: skip
    prompt = "Query both."
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "rules": [
                {
                    "match": re.escape(prompt),
                    "responses": [
                        {"tool_calls": [{"name": "run_sql", "arguments": {
                            "datasource": "net_pg", "query": "SELECT 41 + 1 AS answer"}}]},
                        {"tool_calls": [{"name": "run_sql", "arguments": {
                            "datasource": "net_maria",
                            "query": "SELECT day, COUNT(*) AS n FROM shop_orders GROUP BY day ORDER BY day"}}]},
                        {"text": "Done."},
                    ],
                }
            ],
        }
    )  # fmt: skip
    conversation = ConversationFactory()
    run = run_to_end(conversation, prompt, datasources=["net_pg", "net_maria"])
    assert run.status == Run.Status.DONE, run.errors
    assert "--unshare-net" in sandbox_command(conversation)
    body = next(
        b
        for b in reversed(scripted_model.requests)
        if any(m.get("content") == prompt for m in b.get("messages", []))
        and len([m for m in b["messages"] if m.get("role") == "tool"]) == 2
    )
    pg_result, maria_result = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    assert "42" in pg_result, pg_result
    assert "Sat" in maria_result and "Sun" in maria_result, maria_result


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_python_agent_harness_reaches_the_model_endpoint_in_an_isolated_network(
    worker_node, scripted_model
):
    require_bubblewrap()
    worker_node.use(HARNESS, PAW_SANDBOX_ISOLATION="bwrap")
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Hi."})
    conversation = ConversationFactory()
    run = run_to_end(conversation, "Hello through the relay.")
    assert run.status == Run.Status.DONE, run.errors
    assert "--unshare-net" in sandbox_command(conversation)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_host_keeps_the_shared_network_for_operators_who_must(worker_node, scripted_model):
    require_bubblewrap()
    worker_node.use(PAW_AGENT, PAW_SANDBOX_ISOLATION="bwrap", PAW_SANDBOX_NETWORK="host")
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "fallback": "Hi."})
    conversation = ConversationFactory()
    assert run_to_end(conversation, "Hello on the host network.").status == Run.Status.DONE
    command = sandbox_command(conversation)
    assert "bwrap" in command
    assert "--unshare-net" not in command and "jail_relay.py" not in command


def _local_index(root) -> None:
    """A PEP 503 index under ``root/simple`` holding one wheel, ``pawnetprobe`` 1.0."""
    import base64
    import hashlib
    import zipfile

    name, dist = "pawnetprobe", "pawnetprobe-1.0"
    files = {
        f"{name}/__init__.py": b"ANSWER = 42\n",
        f"{dist}.dist-info/METADATA": b"Metadata-Version: 2.1\nName: pawnetprobe\nVersion: 1.0\n",
        f"{dist}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }  # fmt: skip
    record = ""
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={digest},{len(data)}\n"
    record += f"{dist}.dist-info/RECORD,,\n"
    folder = root / "simple" / name
    folder.mkdir(parents=True)
    wheel = f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(folder / wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
        archive.writestr(f"{dist}.dist-info/RECORD", record)
    (folder / "index.html").write_text(f'<html><body><a href="{wheel}">{wheel}</a></body></html>')
    (root / "simple" / "index.html").write_text(f'<a href="{name}/">{name}</a>')


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_the_package_index_is_reachable_only_while_an_approved_install_package_runs(
    worker_node, scripted_model, tmp_path
):
    import functools
    import http.server

    from conversations.models import Approval
    from conversations.services.approvals import approval_decide
    from conversations.services.runs import run_start
    from tests.live import wait_for

    require_bubblewrap()
    _local_index(tmp_path)
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    index = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=index.serve_forever, daemon=True).start()
    index_url = f"http://127.0.0.1:{index.server_address[1]}/simple/"
    worker_node.use(PAW_AGENT, PAW_SANDBOX_ISOLATION="bwrap", PAW_SANDBOX_PACKAGE_INDEX=index_url)
    reach = (
        "import os, urllib.request\n"
        "try:\n"
        "    urllib.request.urlopen(os.environ['PIP_INDEX_URL'], timeout=5).read()\n"
        "    print('index reached')\n"
        "except Exception as exc:\n"
        "    print('index refused:', exc)\n"
    )
    use = "import pawnetprobe; print('answer', pawnetprobe.ANSWER)\n" + reach
    prompt = "Install the probe."
    scripted_model.load(
        {
            "api_key": SCRIPTED_API_KEY,
            "untooled": "Title",
            "rules": [
                {
                    "match": re.escape(prompt),
                    "responses": [
                        {"tool_calls": [{"name": "run_python", "arguments": {"code": reach}}]},
                        {"tool_calls": [{"name": "install_package", "arguments": {"package": "pawnetprobe"}}]},
                        {"tool_calls": [{"name": "run_python", "arguments": {"code": use}}]},
                        {"text": "Installed."},
                    ],
                }
            ],
        }
    )  # fmt: skip
    conversation = ConversationFactory()
    run = run_start(user=conversation.user, conversation_id=conversation.id, prompt=prompt)
    approval = wait_for(
        lambda: Approval.objects.filter(run=run, status=Approval.Status.PENDING).first(),
        timeout=60,
        what="the install's confirm",
    )
    assert approval.prompt.startswith("install_package:")
    approval_decide(approval_id=approval.id, user=conversation.user, approved=True)
    run = wait_for(
        lambda: Run.objects.filter(id=run.id, status__in=Run.FINISHED_STATUSES).first(), timeout=120
    )
    index.shutdown()
    assert run.status == Run.Status.DONE, run.errors
    body = next(
        b
        for b in reversed(scripted_model.requests)
        if any(m.get("content") == prompt for m in b.get("messages", []))
        and len([m for m in b["messages"] if m.get("role") == "tool"]) == 3
    )
    before, install, after = [m["content"] for m in body["messages"] if m.get("role") == "tool"]
    assert "index refused:" in before and NOT_ALLOWED in before, before
    assert "pawnetprobe" in install and "failed" not in install, install
    assert "answer 42" in after, after
    assert "index refused:" in after and NOT_ALLOWED in after, after  # closed again


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_datasources_allowed_hosts_open_for_the_runs_that_use_it_only(
    worker_node, scripted_model, tmp_path
):
    """An operator allows one more destination on a datasource: a run given that
    datasource reaches it through PAW's proxy, a run without it is refused."""
    require_bubblewrap()
    worker_node.use(PAW_AGENT, PAW_SANDBOX_ISOLATION="bwrap")
    extra = Listener("127.0.0.3")
    datasource_made(
        slug="net_lite",
        name="Lite",
        dialect="sqlite",
        connection={"database": str(tmp_path / "lite.sqlite3")},
        allowed_hosts=[f"{extra.host}:{extra.port}"],
    )
    code = f"TARGETS = {json.dumps({'extra': [extra.host, extra.port]})}\n{PROBE}"
    rules = [
        {
            "match": re.escape(prompt),
            "responses": [
                {"tool_calls": [{"name": "run_python", "arguments": {"code": code}}]},
                {"text": "Probed."},
            ],
        }
        for prompt in ("With the datasource.", "Without it.")
    ]
    scripted_model.load({"api_key": SCRIPTED_API_KEY, "untooled": "Title", "rules": rules})
    given = ConversationFactory()
    run = run_to_end(given, "With the datasource.", datasources=["net_lite"])
    assert run.status == Run.Status.DONE, run.errors
    results = _probe_results(scripted_model, "With the datasource.")
    assert results["extra connect"][0] == "reached", results
    assert results["extra socket"][0] != "reached"  # only through PAW's relay
    reached = extra.accepted
    assert reached >= 1

    other = ConversationFactory(user=given.user)
    run = run_to_end(other, "Without it.")
    assert run.status == Run.Status.DONE, run.errors
    results = _probe_results(scripted_model, "Without it.")
    assert results["extra connect"][0] != "reached"
    assert NOT_ALLOWED in results["extra connect"][1]
    assert extra.accepted == reached
    extra.close()


def test_the_plan_adds_the_runs_datasource_hosts_to_the_operators_patterns(settings):
    settings.PAW_SANDBOX_ALLOWED_HOSTS = ["pypi.org:443"]
    plan = network_plan(
        {},
        (
            run_datasource(
                "a", "sqlite", "A_URL", allowed_hosts=("api.internal:443", "*.corp.test")
            ),
            run_datasource("b", "sqlite", "B_URL", allowed_hosts=("api.internal:443",)),
        ),
    )
    assert plan.policy.patterns == ("pypi.org:443", "api.internal:443", "*.corp.test")
    assert destination_refusal("api.internal", 443, ["10.3.3.3"], plan.policy) is None
    assert destination_refusal("git.corp.test", 22, ["10.3.3.4"], plan.policy) is None
    assert NOT_ALLOWED in destination_refusal("api.internal", 80, ["10.3.3.3"], plan.policy)
    # Metadata addresses stay refused whatever a datasource allows.
    metadata = network_plan(
        {}, (run_datasource("m", "sqlite", "M_URL", allowed_hosts=("169.254.169.254",)),)
    )
    assert "never allowed" in destination_refusal("169.254.169.254", 80, [], metadata.policy)
