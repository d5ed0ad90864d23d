"""A sandbox's network (``PAW_SANDBOX_NETWORK=isolated``): what it may reach, and the
node-side forwarder that reaches it.

Under bubblewrap with ``--unshare-net`` a sandbox has only a loopback interface of its
own. Its run's destinations reach it through PAW:

* Inside the jail, ``sandboxes/jail_relay.py`` (stdlib, started before the runtime)
  listens on ``127.0.0.1``: an HTTP proxy port (:data:`PROXY_PORT`, the runtime gets
  ``HTTPS_PROXY``/``HTTP_PROXY``/``ALL_PROXY`` naming it) and one TCP port per plain
  destination (a datasource, an ``http://`` model endpoint: its URL is rewritten to
  ``127.0.0.1:<port>``). Each connection it accepts is piped to a Unix socket bound into
  the jail, after a one-line preface (``PROXY`` or ``TCP <host> <port>``).
* On the node, :class:`SandboxNetwork` (asyncio, one loop thread for the node) serves that
  socket: it resolves the destination, asks :func:`destination_refusal` (the policy, a
  pure function), connects to the address it checked (never resolving again) and pipes.
  A refused destination gets a ``403`` (proxy) or a ``paw: …`` line (TCP), and the
  sandbox's ``on_refused`` callback (log with the run id, one ``notice`` per run).

The preface comes from inside the jail, so it is untrusted: every destination is checked
here, whatever the relay claims.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

from django.conf import settings

if TYPE_CHECKING:
    from secrets_vault.services.sandbox import RunDatasource

logger = logging.getLogger(__name__)

#: The HTTP proxy port of the relay inside the jail (the jail's loopback is its own).
PROXY_PORT = 3128
#: The first port the relay gives to a plain TCP destination.
FIRST_FORWARD_PORT = 15000
#: Where the node's socket folder is bound inside the jail.
JAIL_DIR = "/run/paw-net"
SOCKET_NAME = "forward.sock"
#: Seconds the node waits to connect to a destination.
CONNECT_TIMEOUT = 10.0
#: Bytes of an HTTP request head the forwarder reads at most.
MAX_HEAD = 64 * 1024

#: Never reachable, whatever is configured: link-local (the cloud metadata services live
#: there: 169.254.169.254, fd00:ec2::254 on AWS IPv6, Alibaba's 100.100.100.200) and
#: "this network".
FORBIDDEN_NETWORKS = tuple(
    ipaddress.ip_network(net)
    for net in (
        "169.254.0.0/16",
        "fe80::/10",
        "fd00:ec2::254/128",
        "100.100.100.200/32",
        "0.0.0.0/8",
        "::/128",
    )
)
_THIS_NETWORK = ipaddress.ip_network("0.0.0.0/8")
METADATA_NAMES = frozenset({"metadata.google.internal", "metadata", "metadata.azure.internal"})

RELAY = str(Path(__file__).resolve().parent / "jail_relay.py")


# --- policy ---------------------------------------------------------------------------


@dataclass(frozen=True)
class NetworkPolicy:
    """What a sandbox may reach.

    ``allowed``: exact ``(host, port)`` pairs (host lower-cased) of the run: its model and
    embedding endpoints, its datasources. ``datasources``: the datasource pairs among them
    (they may name PAW's own services). ``patterns``: ``PAW_SANDBOX_ALLOWED_HOSTS`` entries
    (``host``, ``host:port``, ``*.domain``, ``*.domain:port``). ``paw_services``: PAW's own
    database and broker as ``(address or host, port)``, refused unless a datasource.
    ``package_index``: the package index's pairs, allowed only while an approved
    ``install_package`` runs (``index_open``).
    """

    allowed: frozenset[tuple[str, int]] = frozenset()
    datasources: frozenset[tuple[str, int]] = frozenset()
    patterns: tuple[str, ...] = ()
    paw_services: frozenset[tuple[str, int]] = frozenset()
    package_index: frozenset[tuple[str, int]] = frozenset()


def _pattern_matches(pattern: str, host: str, port: int) -> bool:
    pattern = pattern.strip().lower()
    name, _, wanted_port = pattern.rpartition(":") if pattern.count(":") == 1 else (pattern, "", "")
    if not name:
        name, wanted_port = pattern, ""
    if wanted_port and wanted_port != str(port):
        return False
    if name.startswith("*."):
        return host.endswith(name[1:])
    return host == name


def destination_refusal(
    host: str, port: int, addresses: list[str], policy: NetworkPolicy, *, index_open: bool = False
) -> str | None:
    """Why ``host:port`` (resolved to ``addresses``, IP strings) may not be reached by a
    sandbox under ``policy``, or ``None`` when it may. Pure: resolves nothing.

    Refused, in this order: a bad port; a metadata host name or any address in
    :data:`FORBIDDEN_NETWORKS` (link-local, metadata: never allowed, not even by
    ``PAW_SANDBOX_ALLOWED_HOSTS``); PAW's own database or broker unless that very
    ``host:port`` is a datasource of the run; anything neither in ``policy.allowed`` nor
    matching ``policy.patterns`` (nor, while ``index_open``, in ``policy.package_index``).
    """
    host = host.strip().lower().rstrip(".").strip("[]")
    if not 0 < port < 65536:
        return f"{host}:{port} is not a valid destination"
    if host in METADATA_NAMES:
        return f"{host}:{port} is a cloud metadata service, never allowed for a sandbox"
    for address in [host, *addresses]:
        try:
            ip = ipaddress.ip_address(address.split("%", 1)[0])
        except ValueError:
            continue
        if ip.version == 6 and ip.ipv4_mapped:
            ip = ip.ipv4_mapped
        if ip.is_unspecified or ip in _THIS_NETWORK:
            return f"{host}:{port} is an unspecified address (this host), never allowed"
        if any(ip in net for net in FORBIDDEN_NETWORKS):
            return (
                f"{host}:{port} is a link-local or cloud metadata address, never allowed "
                "for a sandbox"
            )
    if (host, port) not in policy.datasources:
        for address in [host, *addresses]:
            if (address, port) in policy.paw_services:
                return f"{host}:{port} is PAW's own database or broker: not allowed for this run"
    if (host, port) in policy.allowed:
        return None
    if index_open and (host, port) in policy.package_index:
        return None
    if any(_pattern_matches(pattern, host, port) for pattern in policy.patterns):
        return None
    return f"{host}:{port} is not allowed for this run"


def _endpoint(url: str) -> tuple[str, int] | None:
    """``(host, port)`` of an ``http(s)://`` URL, or ``None``."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    return parts.hostname.lower(), port or (443 if parts.scheme == "https" else 80)


def _service_endpoints() -> set[tuple[str, int]]:
    """PAW's own database and broker (and their resolved addresses), as ``(host, port)``."""
    found: set[tuple[str, int]] = set()
    database = settings.DATABASES["default"]
    if database.get("HOST") and "postgresql" in database.get("ENGINE", ""):
        found.add((str(database["HOST"]).lower(), int(database.get("PORT") or 5432)))
    for url in (settings.REDIS_URL, getattr(settings, "CELERY_BROKER_URL", "") or ""):
        try:
            parts = urlsplit(url)
            if parts.scheme in ("redis", "rediss") and parts.hostname:
                found.add((parts.hostname.lower(), parts.port or 6379))
        except ValueError:
            continue
    resolved = set()
    for host, port in found:
        with contextlib.suppress(OSError):
            for info in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
                resolved.add((str(info[4][0]), port))
    return found | resolved


# --- plan: what the jail gets ----------------------------------------------------------


@dataclass(frozen=True)
class Forward:
    """A plain TCP destination: the relay's ``127.0.0.1:local_port`` leads to ``host:port``."""

    local_port: int
    host: str
    port: int

    def relay_arg(self) -> str:
        return f"{self.local_port}={self.host}:{self.port}"


@dataclass(frozen=True)
class NetworkPlan:
    """The network of one sandbox: its ``policy``, the relay's ``forwards``, and ``env``,
    the variables that replace or add to the sandbox environment (rewritten URLs, the
    proxy variables). ``repr`` hides ``env`` (it holds datasource URLs)."""

    policy: NetworkPolicy
    forwards: tuple[Forward, ...] = ()
    env: dict[str, str] = field(default_factory=dict, repr=False)


def _datasource_variables(
    env: dict[str, str], datasources: tuple[RunDatasource, ...]
) -> dict[str, str]:
    """``{URL variable: dialect}`` of the run's server datasources (not SQLite) in ``env``."""
    return {
        datasource.env_name: datasource.dialect
        for datasource in datasources
        if datasource.env_name in env and datasource.dialect in ("postgresql", "mysql")
    }


def _rewrite_postgres(url: str, local_port: int) -> str:
    """The libpq URI ``url`` with its port set to ``local_port`` and ``hostaddr=127.0.0.1``:
    libpq connects to the relay, while the host name stays for TLS (``sslmode=verify-full``)."""
    parts = urlsplit(url)
    userinfo, _, _ = parts.netloc.rpartition("@")
    host = parts.hostname or "localhost"
    shown = f"[{host}]" if ":" in host else host
    netloc = f"{userinfo}@{shown}:{local_port}" if userinfo else f"{shown}:{local_port}"
    query = [(k, v) for k, v in parse_qsl(parts.query, keep_blank_values=True) if k != "hostaddr"]
    query.append(("hostaddr", "127.0.0.1"))
    return urlunsplit((parts.scheme, netloc, parts.path, urlencode(query, quote_via=quote), ""))


def _rewrite_host_port(url: str, local_port: int) -> str:
    """``url`` with its host and port replaced by ``127.0.0.1:local_port``."""
    parts = urlsplit(url)
    userinfo, _, _ = parts.netloc.rpartition("@")
    netloc = f"{userinfo}@127.0.0.1:{local_port}" if userinfo else f"127.0.0.1:{local_port}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def network_plan(
    env: dict[str, str], run_datasources: tuple[RunDatasource, ...] = ()
) -> NetworkPlan:
    """The plan of a sandbox whose environment (before isolation) is ``env``, for a run of
    ``run_datasources`` (their URLs are in ``env``).

    Allowed: the host:port of ``OPENAI_BASE_URL`` and ``PAW_EMBEDDING_BASE_URL`` and of
    each PostgreSQL / MySQL datasource URL, plus ``PAW_SANDBOX_ALLOWED_HOSTS`` and the
    run's datasources' own ``allowed_hosts`` (each once, in the run's order). An
    ``https://`` endpoint keeps its URL (reached through the proxy, TLS verifies the real
    host); an ``http://`` one and each datasource get a TCP forward, their URLs rewritten
    to the relay's port (PostgreSQL keeps its host name and adds ``hostaddr``; MySQL's
    host becomes ``127.0.0.1``, so ``ssl_verify_identity`` cannot hold through it).
    """
    allowed: set[tuple[str, int]] = set()
    datasources: set[tuple[str, int]] = set()
    forwards: list[Forward] = []
    rewritten: dict[str, str] = {}
    by_destination: dict[tuple[str, int], Forward] = {}

    def forward(host: str, port: int) -> Forward:
        if (host, port) not in by_destination:
            by_destination[(host, port)] = Forward(FIRST_FORWARD_PORT + len(forwards), host, port)
            forwards.append(by_destination[(host, port)])
        return by_destination[(host, port)]

    for name in ("OPENAI_BASE_URL", "PAW_EMBEDDING_BASE_URL"):
        url = env.get(name, "")
        endpoint = _endpoint(url)
        if endpoint is None:
            continue
        allowed.add(endpoint)
        if urlsplit(url).scheme == "http":
            rewritten[name] = _rewrite_host_port(url, forward(*endpoint).local_port)
    for name, dialect in _datasource_variables(env, run_datasources).items():
        url = env[name]
        try:
            parts = urlsplit(url)
            port = parts.port or (5432 if dialect == "postgresql" else 3306)
        except ValueError:
            continue
        if not parts.hostname or parts.hostname.startswith("/"):
            continue
        endpoint = (parts.hostname.lower(), port)
        allowed.add(endpoint)
        datasources.add(endpoint)
        local = forward(*endpoint).local_port
        rewritten[name] = (
            _rewrite_postgres(url, local)
            if dialect == "postgresql"
            else _rewrite_host_port(url, local)
        )
    index: set[tuple[str, int]] = set()
    index_url = settings.PAW_SANDBOX_PACKAGE_INDEX
    endpoint = _endpoint(index_url)
    if endpoint is not None:
        index.add(endpoint)
        if endpoint == ("pypi.org", 443):
            index.add(("files.pythonhosted.org", 443))  # where PyPI's files are
        if urlsplit(index_url).scheme == "http":
            rewritten["PIP_INDEX_URL"] = _rewrite_host_port(
                index_url, forward(*endpoint).local_port
            )
        else:
            rewritten["PIP_INDEX_URL"] = index_url
    proxy = f"http://127.0.0.1:{PROXY_PORT}"
    for name in ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY"):
        rewritten[name] = proxy
        rewritten[name.lower()] = proxy
    policy = NetworkPolicy(
        allowed=frozenset(allowed),
        datasources=frozenset(datasources),
        patterns=(
            *settings.PAW_SANDBOX_ALLOWED_HOSTS,
            *dict.fromkeys(h for d in run_datasources for h in d.allowed_hosts if h.strip()),
        ),
        paw_services=frozenset(_service_endpoints()),
        package_index=frozenset(index),
    )
    return NetworkPlan(policy=policy, forwards=tuple(forwards), env=rewritten)


#: The TCP forwards a spare's relay binds (``FIRST_FORWARD_PORT`` on): a run whose plan
#: needs more is not given a spare.
SPARE_FORWARD_PORTS = 16


def spare_plan() -> NetworkPlan:
    """The plan of a spare sandbox before its hand-over: nothing allowed (no endpoint, no
    pattern, not even ``PAW_SANDBOX_ALLOWED_HOSTS``), no forward; its ``env`` has the
    proxy variables, which are the same for every sandbox, so that the runtime's HTTP
    transport can be built before the hand-over."""
    proxy = f"http://127.0.0.1:{PROXY_PORT}"
    names = ("HTTPS_PROXY", "HTTP_PROXY", "ALL_PROXY")
    return NetworkPlan(
        policy=NetworkPolicy(), env={n: proxy for name in names for n in (name, name.lower())}
    )


def relay_prefix(plan: NetworkPlan, *, spare: bool = False) -> list[str]:
    """The relay's command inside the jail (before the runtime's argv). ``spare``: the
    relay binds :data:`SPARE_FORWARD_PORTS` forward ports whose destinations the node
    takes from the plan the sandbox has when a connection comes (its hand-over's)."""
    args = [sys.executable, "-I", "-S", f"{JAIL_DIR}/jail_relay.py"]
    args += ["--socket", f"{JAIL_DIR}/{SOCKET_NAME}", "--proxy", str(PROXY_PORT)]
    for item in plan.forwards:
        args += ["--forward", item.relay_arg()]
    if spare:
        last = FIRST_FORWARD_PORT + SPARE_FORWARD_PORTS - 1
        args += ["--ports", f"{FIRST_FORWARD_PORT}-{last}"]
    return [*args, "--"]


# --- the node-side forwarder -----------------------------------------------------------


class _Loop:
    """The node's forwarding event loop, in one daemon thread (started on first use)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._loop.is_closed():
                loop = asyncio.new_event_loop()
                threading.Thread(
                    target=loop.run_forever, name="paw-sandbox-network", daemon=True
                ).start()
                cls._loop = loop
            return cls._loop


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
    except (OSError, asyncio.IncompleteReadError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            if writer.can_write_eof():
                writer.write_eof()
            else:
                writer.close()


async def _answer_and_close(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, data: bytes
) -> None:
    """Write ``data``, end the writing side, and read what the client still sends (up to
    its end, at most 5 s) before closing: a socket closed with unread data resets the
    connection, and the client could lose the answer (the refusal's reason)."""
    try:
        writer.write(data)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(5):
            while await reader.read(1 << 16):
                pass
    except (OSError, TimeoutError, RuntimeError):
        pass
    finally:
        writer.close()


class SandboxNetwork:
    """The forwarder of one sandbox: a Unix socket in a private folder of the node
    (``folder``, bound into the jail at :data:`JAIL_DIR` with the relay's source).

    ``on_refused(destination, reason)`` is called (from a helper thread, never the loop)
    for each refused destination. ``start()`` returns the folder; ``close()`` ends the
    server and removes the folder (never raises). ``plan`` is read for each new
    connection: a spare's is replaced at its hand-over (:func:`spare_plan` before)."""

    def __init__(self, plan: NetworkPlan, on_refused: Callable[[str, str], None]) -> None:
        self.plan = plan
        self.on_refused = on_refused
        self.folder: Path | None = None
        self._server: asyncio.AbstractServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        #: True while an approved ``install_package`` runs: the package index is allowed.
        self.index_open = False

    def start(self) -> Path:
        """Create the folder and serve its socket. Raises ``OSError``."""
        self.folder = Path(tempfile.mkdtemp(prefix="paw-net-"))
        shutil.copyfile(RELAY, self.folder / "jail_relay.py")
        self._loop = _Loop.get()
        path = str(self.folder / SOCKET_NAME)
        future = asyncio.run_coroutine_threadsafe(
            asyncio.start_unix_server(self._handle, path=path, limit=MAX_HEAD), self._loop
        )
        self._server = future.result(timeout=10)
        return self.folder

    def close(self) -> None:
        """Stop serving (connections already piped end with the jail) and remove the folder."""
        server, self._server = self._server, None
        if server is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(server.close)
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    # The connection handler (runs in the loop).

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Held here while it runs: the stream protocol drops its own reference to this task
        # when the jail's side of the connection is lost, before the other side is done.
        task = asyncio.current_task()
        self._tasks.add(task)
        try:
            await self._serve_connection(reader, writer)
        finally:
            self._tasks.discard(task)

    async def _serve_connection(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            preface = (await asyncio.wait_for(reader.readline(), 30)).decode("latin-1").split()
            if len(preface) == 3 and preface[0] == "TCP":
                await self._tcp(preface[1], int(preface[2]), reader, writer)
            elif len(preface) == 2 and preface[0] == "PORT":
                await self._port(int(preface[1]), reader, writer)
            elif preface == ["PROXY"]:
                await self._proxy(reader, writer)
            else:
                writer.close()
        except (TimeoutError, OSError, ValueError, asyncio.LimitOverrunError, EOFError):
            with contextlib.suppress(OSError):
                writer.close()
        except Exception:
            logger.exception("sandbox network: a connection failed")
            writer.close()

    async def _open(
        self, host: str, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter] | str:
        """A connection to ``host:port`` if the policy allows it, else the refusal text."""
        host = host.strip("[]").lower()
        loop = asyncio.get_running_loop()
        try:
            infos = await asyncio.wait_for(
                loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), CONNECT_TIMEOUT
            )
        except (TimeoutError, OSError):
            infos = []
        addresses = [str(info[4][0]) for info in infos]
        refusal = destination_refusal(
            host, port, addresses, self.plan.policy, index_open=self.index_open
        )
        if refusal is None and not addresses:
            return f"{host}:{port}: the name does not resolve"
        if refusal is not None:
            loop.run_in_executor(None, self.on_refused, f"{host}:{port}", refusal)
            return refusal
        last: Exception | None = None
        for address in addresses:
            try:
                return await asyncio.wait_for(
                    asyncio.open_connection(address, port), CONNECT_TIMEOUT
                )
            except (TimeoutError, OSError) as exc:
                last = exc
        return f"{host}:{port}: cannot connect ({last or 'no address'})"

    async def _port(self, local_port: int, reader, writer) -> None:
        """A connection to the relay's ``local_port`` (a spare's relay says only that):
        the destination of that port in the plan the sandbox has now, checked like any."""
        for item in self.plan.forwards:
            if item.local_port == local_port:
                return await self._tcp(item.host, item.port, reader, writer)
        reason = f"nothing is forwarded on port {local_port} for this run"
        loop = asyncio.get_running_loop()
        loop.run_in_executor(None, self.on_refused, f"127.0.0.1:{local_port}", reason)
        await _answer_and_close(reader, writer, f"paw: {reason}\n".encode())

    async def _tcp(self, host: str, port: int, reader, writer) -> None:
        opened = await self._open(host, port)
        if isinstance(opened, str):
            await _answer_and_close(reader, writer, f"paw: {opened}\n".encode())
            return
        await self._splice(reader, writer, *opened)

    async def _proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        request_line, _, rest = head.partition(b"\r\n")
        method, target, version = request_line.decode("latin-1").split(" ", 2)
        if method.upper() == "CONNECT":
            host, _, port = target.rpartition(":")
            if not (host and port.isascii() and port.isdigit() and port[0] != "0"):
                # "+8410", "08410", "8410 ": one spelling per port, as a browser sends it
                return await self._forbidden(
                    reader, writer, f"{target[:200]} is not a valid destination"
                )
            opened = await self._open(host, int(port))
            if isinstance(opened, str):
                return await self._forbidden(reader, writer, opened)
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            return await self._splice(reader, writer, *opened)
        parts = urlsplit(target)
        if parts.scheme != "http" or not parts.hostname:
            return await self._forbidden(
                reader, writer, f"{target[:200]} is not a proxy request PAW forwards"
            )
        opened = await self._open(parts.hostname, parts.port or 80)
        if isinstance(opened, str):
            return await self._forbidden(reader, writer, opened)
        path = urlunsplit(("", "", parts.path or "/", parts.query, ""))
        headers = [
            line
            for line in rest.split(b"\r\n")
            if line and not line.lower().startswith((b"connection:", b"proxy-connection:"))
        ]
        upstream_reader, upstream_writer = opened
        # One request per proxied connection: the client opens another for the next one.
        upstream_writer.write(
            f"{method} {path} {version}\r\n".encode("latin-1")
            + b"".join(line + b"\r\n" for line in headers)
            + b"Connection: close\r\n\r\n"
        )
        await self._splice(reader, writer, upstream_reader, upstream_writer)

    @staticmethod
    async def _forbidden(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, reason: str
    ) -> None:
        body = f"paw: {reason}\n".encode()
        # The reason phrase says it too: clients put it in their error ("Tunnel connection
        # failed: 403 ..."), most never show a CONNECT's body.
        phrase = "Forbidden by PAW: " + reason.encode("ascii", "replace").decode()
        await _answer_and_close(
            reader,
            writer,
            f"HTTP/1.1 403 {phrase}\r\n".encode()
            + b"Content-Type: text/plain; charset=utf-8\r\n"
            + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body,
        )

    @staticmethod
    async def _splice(reader, writer, upstream_reader, upstream_writer) -> None:
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        for w in (writer, upstream_writer):
            with contextlib.suppress(OSError, RuntimeError):
                w.close()
