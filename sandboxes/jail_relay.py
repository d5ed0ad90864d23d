"""The relay inside a sandbox's network namespace (stdlib only, run ``python -I -S``).

    jail_relay.py --socket PATH --proxy PORT [--forward LPORT=HOST:PORT ...]
                  [--ports FIRST-LAST] -- ARGV...

Binds ``127.0.0.1:PORT`` (HTTP proxy) and each ``127.0.0.1:LPORT``, then starts ``ARGV``
(the runtime) as its child, with the runtime's standard streams and inherited descriptors
(``--secrets-fd``), and pipes every accepted connection to the node's Unix socket ``PATH``
after a one-line preface: ``PROXY`` or ``TCP HOST PORT``. ``--ports`` binds every port
from FIRST to LAST with the preface ``PORT LPORT``, destination unsaid: a spare sandbox's
relay, whose destinations the node learns at its hand-over. The node decides; this
process only carries bytes. It exits with the runtime's status (signals it gets are
passed on).
"""

import asyncio
import contextlib
import os
import signal
import socket
import sys


def _parse(argv):
    socket_path, proxy, forwards, ports = None, None, [], []
    i = 0
    while i < len(argv) and argv[i] != "--":
        flag, value = argv[i], argv[i + 1]
        if flag == "--socket":
            socket_path = value
        elif flag == "--proxy":
            proxy = int(value)
        elif flag == "--forward":
            local, _, destination = value.partition("=")
            host, _, port = destination.rpartition(":")
            forwards.append((int(local), host, int(port)))
        elif flag == "--ports":
            first, _, last = value.partition("-")
            ports.extend(range(int(first), int(last) + 1))
        else:
            raise SystemExit(f"jail_relay: unknown option {flag}")
        i += 2
    return socket_path, proxy, forwards, ports, argv[i + 1 :]


def _listen(port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    return sock


async def _pipe(reader, writer):
    try:
        while True:
            data = await reader.read(1 << 16)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except OSError:
        pass
    finally:
        try:
            if writer.can_write_eof():
                writer.write_eof()
        except (OSError, RuntimeError):
            pass


def _handler(socket_path, preface):
    async def handle(reader, writer):
        try:
            upstream_reader, upstream_writer = await asyncio.open_unix_connection(socket_path)
        except OSError as exc:
            writer.write(f"paw: the sandbox's network forwarder is gone ({exc})\n".encode())
            writer.close()
            return
        upstream_writer.write(preface)
        await asyncio.gather(_pipe(reader, upstream_writer), _pipe(upstream_reader, writer))
        for w in (writer, upstream_writer):
            with contextlib.suppress(OSError):
                w.close()

    return handle


async def _serve(socket_path, listeners, child):
    for sock, preface in listeners:
        await asyncio.start_server(_handler(socket_path, preface), sock=sock)
    loop = asyncio.get_running_loop()
    status = await loop.run_in_executor(None, os.waitpid, child, 0)
    return status[1]


def _not_dumpable():
    """Like paw-agent: the jail's code may not read this process's memory or environment."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE, 0
    except (OSError, AttributeError, ImportError):
        pass


def main(argv):
    socket_path, proxy, forwards, ports, command = _parse(argv)
    if not command:
        raise SystemExit("jail_relay: no command after --")
    listeners = [(_listen(proxy), b"PROXY\n")] if proxy else []
    for local, host, port in forwards:
        listeners.append((_listen(local), f"TCP {host} {port}\n".encode()))
    for local in ports:
        listeners.append((_listen(local), f"PORT {local}\n".encode()))
    child = os.fork()
    if child == 0:
        for sock, _ in listeners:
            sock.close()
        os.execvp(command[0], command)  # noqa: S606 - the runtime, as PAW built it
    # The relay keeps only its listeners: not the runtime's pipes (its end of the
    # sandbox's stdin/stdout would keep them open) nor a secrets descriptor.
    keep = sorted(sock.fileno() for sock, _ in listeners)
    low = 3
    for fd in keep:
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, 65536)
    _not_dumpable()
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda s, _f: os.kill(child, s))
    status = asyncio.run(_serve(socket_path, listeners, child))
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
