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

import contextlib
import errno
import os
import selectors
import signal
import socket
import sys

#: Bytes read from a socket at a time (and the most held for a slow receiver).
CHUNK = 1 << 16


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


class _Direction:
    """Bytes from ``source`` to ``target``: what was read and not yet written, and
    whether ``source`` has ended (then ``target``'s writing side is shut once all is
    written)."""

    def __init__(self, source, target):
        self.source, self.target = source, target
        self.pending = b""
        self.ended = False
        self.done = False


class _Pipe:
    """One accepted connection and its connection to the node, pumped both ways
    (non-blocking, by the relay's one selector loop). A socket is registered only while
    there is something to wait for on it (a read when its outgoing bytes are written, a
    write when bytes for it wait), so a busy peer never spins the loop."""

    def __init__(self, relay, inside, outside):
        self.selector = relay.selector
        self.sockets = (inside, outside)
        self.directions = (_Direction(inside, outside), _Direction(outside, inside))
        self.masks = {}
        for sock in self.sockets:
            sock.setblocking(False)
        self._update()

    def handle(self, sock, mask):
        for direction in self.directions:
            if direction.done:
                continue
            if sock is direction.source and mask & selectors.EVENT_READ and not direction.pending:
                try:
                    data = sock.recv(CHUNK)
                except BlockingIOError:
                    data = None
                except OSError:
                    data = b""
                if data == b"":
                    direction.ended = True
                elif data:
                    direction.pending = data
            if direction.pending or direction.ended:
                self._flush(direction)
        self._update()

    @staticmethod
    def _flush(direction):
        try:
            while direction.pending:
                sent = direction.target.send(direction.pending)
                direction.pending = direction.pending[sent:]
        except BlockingIOError:
            return
        except OSError:  # the receiver is gone: nothing more goes that way
            direction.pending, direction.ended = b"", True
        if direction.ended and not direction.pending:
            direction.done = True
            with contextlib.suppress(OSError):
                direction.target.shutdown(socket.SHUT_WR)

    def _update(self):
        if all(direction.done for direction in self.directions):
            for sock in self.sockets:
                if self.masks.pop(sock, 0):
                    self.selector.unregister(sock)
                sock.close()
            return
        for sock in self.sockets:
            mask = 0
            for direction in self.directions:
                if direction.done:
                    continue
                if sock is direction.source and not direction.pending and not direction.ended:
                    mask |= selectors.EVENT_READ
                if sock is direction.target and direction.pending:
                    mask |= selectors.EVENT_WRITE
            before = self.masks.get(sock, 0)
            if mask == before:
                continue
            if not before:
                self.selector.register(sock, mask, self)
            elif not mask:
                self.selector.unregister(sock)
            else:
                self.selector.modify(sock, mask, self)
            self.masks[sock] = mask


class _Relay:
    """The selector loop: listeners, pipes, and the wake-up pipe of signals."""

    def __init__(self, socket_path, listeners):
        self.socket_path = socket_path
        self.selector = selectors.DefaultSelector()
        for sock, preface in listeners:
            sock.setblocking(False)
            self.selector.register(sock, selectors.EVENT_READ, ("listen", preface))

    def accept(self, listener, preface):
        try:
            inside, _ = listener.accept()
        except OSError:
            return
        outside = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            outside.settimeout(10)
            outside.connect(self.socket_path)
            outside.sendall(preface)
        except OSError as exc:
            outside.close()
            with contextlib.suppress(OSError):
                inside.sendall(f"paw: the sandbox's network forwarder is gone ({exc})\n".encode())
            inside.close()
            return
        _Pipe(self, inside, outside)

    def run(self, child, wakeup):
        """Pump until the runtime (``child``) exits; its wait status."""
        self.selector.register(wakeup, selectors.EVENT_READ, ("wakeup", None))
        while True:
            pid, status = os.waitpid(child, os.WNOHANG)
            if pid == child:
                return status
            for key, mask in self.selector.select(timeout=1.0):
                data = key.data
                if isinstance(data, tuple) and data[0] == "listen":
                    self.accept(key.fileobj, data[1])
                elif isinstance(data, tuple):  # a signal arrived (SIGCHLD among them)
                    with contextlib.suppress(OSError):
                        os.read(wakeup, 512)
                else:
                    data.handle(key.fileobj, mask)


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
    wakeup_read, wakeup_write = os.pipe()
    for fd in (wakeup_read, wakeup_write):
        os.set_blocking(fd, False)
    signal.set_wakeup_fd(wakeup_write)
    signal.signal(signal.SIGCHLD, lambda s, _f: None)  # wakes the loop: the runtime ended
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, lambda s, _f: os.kill(child, s))
    relay = _Relay(socket_path, listeners)
    try:
        status = relay.run(child, wakeup_read)
    except OSError as exc:
        if exc.errno != errno.ECHILD:
            raise
        status = 0
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
