"""``manage.py runpaw``: start the whole product (what ``make run`` calls after migrating).

Embedded mode (``PAW_REDIS_URL`` empty): one process runs the web server (uvicorn,
``paw_project.web``), a Celery worker thread on an in-memory broker, and Celery beat in a
thread; it holds a lock in ``PAW_VAR_DIR`` so that a second instance on the same folder
refuses to start. With ``PAW_REDIS_URL`` set: ``PAW_WEB_PROCESSES`` web processes sharing
one listening socket, a Celery worker node and Celery beat run as child processes; Ctrl-C
(or SIGTERM) stops them all, each given ``--grace`` seconds before it is killed. The
listening socket is bound here first, so a port in use is refused before anything starts.

Unless ``PAW_DEMO=0`` (or, by default, with Redis), the offline demo's scripted model is
started on a free loopback port and offered to every user as provider ``demo``, so that a
new install shows the whole loop without any API key; ``PAW_DEMO_BASE_URL`` tells the web
server and the worker where it listens.

Exits non-zero when PAW cannot start (the port is taken or invalid, the var folder is in
use) or when a child process exits on its own (naming it).
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO, Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

logger = logging.getLogger("paw.run")

#: Seconds the process may take to exit after PAW stopped, before it is ended regardless
#: (a thread stuck in a task or a request must not keep a stopped PAW alive).
EXIT_WATCHDOG_SECONDS = 10.0


def browser_url(host: str, port: int) -> str:
    """The address to open in a browser for a server listening on ``host:port``."""
    if host in ("", "0.0.0.0"):  # noqa: S104 - names every interface; loopback is one
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host.strip('[]')}]"
    return f"http://{host}:{port}/"


def listen_socket(host: str, port: int) -> socket.socket:
    """The listening socket of the web server(s) on ``host:port``; raises
    :class:`CommandError` with a one-line reason when it cannot be had."""
    from paw_project.web import listen

    if not 1 <= port <= 65535:
        raise CommandError(f"Port {port} is not a TCP port: use 1 to 65535, e.g. PAW_PORT=8001.")
    try:
        return listen(host, port)
    except socket.gaierror as exc:
        raise CommandError(f"PAW_HOST={host!r} is not a usable address ({exc.strerror}).") from None
    except PermissionError:
        raise CommandError(
            f"Not allowed to listen on port {port} (below 1024 needs root): "
            "pick another, e.g. PAW_PORT=8001 make run."
        ) from None
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CommandError(
                f"Port {port} on {host} is already in use (another PAW?): stop that server "
                f"or pick another port, e.g. PAW_PORT={port + 1 if port < 65535 else 8001} make run."
            ) from None
        raise CommandError(f"Cannot listen on {host}:{port}: {exc.strerror}.") from None


def lock_var_dir() -> int:
    """Take the embedded mode's lock on ``PAW_VAR_DIR`` (its SQLite file, beat schedule and
    workspaces are one instance's). Returns the file descriptor, to keep open while running;
    raises :class:`CommandError` when another process holds it."""
    var_dir = settings.VAR_DIR
    var_dir.mkdir(parents=True, exist_ok=True)
    path = var_dir / "paw.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        os.close(fd)
        raise CommandError(
            f"Another PAW (pid {holder}) is already running on {var_dir}: stop it first, "
            "or give this one its own PAW_VAR_DIR."
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _relay_json(name: str, pipe: IO[bytes]) -> None:
    """Copy a child's output to our stderr: JSON lines as they are, any other line as the
    message of a ``paw.run.<name>`` log line (JSON too)."""
    child_logger = logging.getLogger(f"paw.run.{name}")
    for raw in iter(pipe.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        if not line.strip():
            continue
        if line.startswith("{"):
            try:
                json.loads(line)
            except ValueError:
                pass
            else:
                sys.stderr.write(line + "\n")
                sys.stderr.flush()
                continue
        child_logger.info("%s", line)
    pipe.close()


def demo_wanted() -> bool:
    """Whether runpaw offers the offline demo (``PAW_DEMO``: ``auto`` means embedded mode
    only), unless a demo endpoint is configured already (``PAW_DEMO_BASE_URL``)."""
    if settings.PAW_DEMO_BASE_URL or settings.PAW_DEMO == "0":
        return False
    return settings.PAW_DEMO == "1" or settings.EMBEDDED


def demo_model_start() -> Any:
    """Start the scripted model with the bundled demo script on a free loopback port and
    point ``settings.PAW_DEMO_BASE_URL`` (and the environment children inherit) at it.
    Returns the running :class:`~scripted_model.ScriptedModel`."""
    from scripted_model import Script, ScriptedModel

    # Every sandbox on the host can reach it: no request log (other users' prompts) and no
    # control endpoints (replacing the script would steer other users' agents).
    model = ScriptedModel(Script.load("demo"), max_log=0, control=False).start()
    settings.PAW_DEMO_BASE_URL = model.base_url
    os.environ["PAW_DEMO_BASE_URL"] = model.base_url
    return model


def demo_datasource_start() -> Any:
    """Offer the demo datasource (``secrets_vault.services.demo``): the tips data set as a
    SQLite file in ``PAW_VAR_DIR/demo/``. Returns the datasource, or None when it cannot
    be made (logged: the demo model still runs)."""
    from secrets_vault.services import demo_datasource_ensure

    try:
        return demo_datasource_ensure(
            csv_path=settings.BASE_DIR / "sample_data" / "tips.csv",
            db_path=settings.DEMO_DATA_DIR / "tips.sqlite3",
        )
    except Exception:  # a demo extra: PAW starts without it
        logger.exception("the demo datasource could not be made")
        return None


def _arm_exit_watchdog(code: int) -> None:
    """End the process with ``code`` if it is still alive ``EXIT_WATCHDOG_SECONDS`` from now."""

    def end() -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    timer = threading.Timer(EXIT_WATCHDOG_SECONDS, end)
    timer.daemon = True
    timer.start()


class Command(BaseCommand):
    help = "Start PAW: web server, Celery worker and beat (embedded or as child processes)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=settings.PAW_HOST)
        parser.add_argument("--port", type=int, default=settings.PAW_PORT)
        parser.add_argument(
            "--grace", type=float, default=30.0, help="seconds a child gets to stop (default 30)"
        )
        parser.add_argument(
            "--check",
            action="store_true",
            help="only check that PAW could start here (its port is free, no other PAW runs "
            "on PAW_VAR_DIR), and exit: `make run` does so before it migrates and creates "
            "the administrator, so that a busy port is said before a one-time password is "
            "printed",
        )

    def _say(self, message: str, *, error: bool = False) -> None:
        """A line for the person at the terminal; a log line when logs are JSON."""
        if settings.PAW_LOG_JSON:
            logger.log(logging.ERROR if error else logging.INFO, message)
        else:
            (self.stderr if error else self.stdout).write(message)
            (self.stderr if error else self.stdout).flush()

    def handle(self, *args, host: str, port: int, grace: float, **options) -> None:
        try:
            if options.get("check"):
                self._check(host, port)
                return
            self._start(host, port, grace)
        except CommandError as exc:
            if not settings.PAW_LOG_JSON:
                raise
            logger.error("%s", exc)  # one JSON line, not Django's plain "CommandError: ..."
            sys.exit(exc.returncode)

    def _check(self, host: str, port: int) -> None:
        """Raise :class:`CommandError` as :meth:`_start` would for the runtime, the port
        or the lock."""
        self._check_runtime()
        lock = lock_var_dir() if settings.EMBEDDED else None
        try:
            listen_socket(host, port).close()
        finally:
            if lock is not None:
                os.close(lock)

    def _check_runtime(self) -> None:
        """Refuse ``PAW_HARNESS_CMD`` naming python-agent-harness without
        ``PAW_ALLOW_UNGATED_RUNTIME`` (:class:`CommandError`), as its worker would; say
        what a runtime other than paw-agent must offer."""
        from sandboxes.launch import UngatedRuntime, runtime_gate_check

        try:
            warning = runtime_gate_check()
        except UngatedRuntime as exc:
            raise CommandError(str(exc)) from exc
        if warning:
            self._say(warning, error=True)

    def _start(self, host: str, port: int, grace: float) -> None:
        self._check_runtime()
        # What PAW writes from here on (the SQLite file's journal, workspaces, uploads) is
        # readable by this user only, as `make run` arranges for its own steps too.
        os.umask(0o077)
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            # A shell starts background jobs with SIGINT ignored (and the web server would
            # leave it so): `kill -INT` must stop PAW all the same, like Ctrl-C in a terminal.
            signal.signal(signal.SIGINT, signal.default_int_handler)
        self._lock_fd = lock_var_dir() if settings.EMBEDDED else None
        listener = listen_socket(host, port)
        url = browser_url(host, port)
        mode = "embedded (one process, no Redis)" if settings.EMBEDDED else "Redis"
        demo = demo_model_start() if demo_wanted() else None
        demo_line = (
            "  Offline demo: provider 'demo' (a scripted model, no AI) is offered until you add "
            "a model key; upload sample_data/tips.csv and ask for the average tip by day, as "
            "a spreadsheet and a chart.\n"
            if demo is not None
            else ""
        )
        if demo is not None and demo_datasource_start() is not None:
            demo_line += (
                "  Demo datasource 'demo-tips' (the tips data set in SQLite): tick 'Tips (demo)' "
                "under Data and ask for the average tip by day from the database.\n"
            )
        registration = (
            "  Sign-up is open: anyone who reaches this page may make an account "
            "(PAW_ALLOW_REGISTRATION=0 closes it).\n"
            if settings.PAW_ALLOW_REGISTRATION
            else "  Sign-up is closed: accounts come from single sign-on or an operator "
            "(PAW_ALLOW_REGISTRATION=1 opens it).\n"
        )
        self._say(
            f"PAW is starting in {mode} mode.\n"
            f"  Open {url}  (admin: {url}admin/, API docs: {url}api/docs/)\n"
            f"{registration}"
            f"{demo_line}"
            "  Lost the admin password? Set a new one with `make changepassword` "
            "(ADMIN_USER=<name> for another account; it runs `manage.py changepassword <name>`).\n"
            "  Stop with Ctrl-C."
        )
        try:
            if settings.EMBEDDED:
                self._run_embedded(listener, grace)
            else:
                self._run_children(listener, grace)
        finally:
            listener.close()
            if demo is not None:
                demo.stop()

    def _run_embedded(self, listener: socket.socket, grace: float) -> None:
        from paw_project.embedded import EmbeddedWorker
        from paw_project.web import serve

        worker = EmbeddedWorker()
        served = interrupted = stopped = False
        try:
            worker.start()
            self._requeue_lost_runs()
            serve(listener)
            served = True
        except KeyboardInterrupt:  # Ctrl-C before the server took over the signals
            interrupted = True
        finally:
            self._say("PAW is stopping…")
            # Stopping can take a while (running tasks, sandboxes): a second Ctrl-C ends
            # the process at once.
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda *_: os._exit(130))
            stopped = worker.stop(timeout=grace)
            _arm_exit_watchdog(0 if (served or interrupted) and stopped else 1)
        if not served and not interrupted:
            raise CommandError("The web server failed (see above).")
        if not stopped:
            raise CommandError(f"PAW stopped, but its worker did not finish within {grace:.0f} s.")
        self._say("PAW stopped.")

    def _requeue_lost_runs(self) -> None:
        """Runs left ``queued`` by a previous embedded process lost their task with its
        in-memory broker: hand them to the worker at once (not after the reaper's minute)."""
        from sandboxes.services import runs_requeue

        count = runs_requeue(older_than_seconds=0)
        if count:
            logger.info("re-sent %d run(s) left queued by the previous start", count)

    def _child_commands(self, listener: socket.socket) -> dict[str, list[str]]:
        """The children by name: ``PAW_WEB_PROCESSES`` web processes (``web``, or ``web-1``
        … when several) on the inherited ``listener``, the worker node and beat."""
        python = sys.executable
        count = settings.PAW_WEB_PROCESSES
        web = [python, "-m", "paw_project.web", "--fd", str(listener.fileno())]
        return {
            **{("web" if count == 1 else f"web-{n}"): web for n in range(1, count + 1)},
            "worker": [python, "-m", "paw_project.worker"],
            "beat": [python, "-m", "paw_project.beat"],
        }

    def _run_children(self, listener: socket.socket, grace: float) -> None:
        children: dict[str, subprocess.Popen] = {}
        stopping = False

        def request_stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        failed: dict[str, int] = {}
        relays: list[threading.Thread] = []
        # With JSON logs the children's output passes through here, so that what they print
        # outside logging (Celery's "Warm shutdown", a crash's traceback) is JSON too.
        output = (
            {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT}
            if settings.PAW_LOG_JSON
            else {}
        )
        try:
            listener.set_inheritable(True)
            for name, command in self._child_commands(listener).items():
                # Own sessions: a terminal's Ctrl-C reaches only us, and we stop each in turn.
                # The web processes share the listening socket (the kernel spreads
                # connections over them).
                fds = (listener.fileno(),) if name.startswith("web") else ()
                children[name] = subprocess.Popen(
                    command, start_new_session=True, pass_fds=fds, **output
                )
                if settings.PAW_LOG_JSON:
                    relay = threading.Thread(
                        target=_relay_json,
                        args=(name, children[name].stdout),
                        name=f"relay-{name}",
                        daemon=True,
                    )
                    relay.start()
                    relays.append(relay)
            listener.close()  # the web processes hold it
            while not stopping:
                failed = {
                    name: code
                    for name, child in children.items()
                    if (code := child.poll()) is not None
                }
                if failed:
                    break
                time.sleep(0.5)
        finally:
            if failed:
                self._say(
                    "PAW: "
                    + ", ".join(f"{name} exited (code {code})" for name, code in failed.items())
                    + "; stopping the rest.",
                    error=True,
                )
            self._stop_children(children, grace)
            for relay in relays:
                relay.join(timeout=2)
        if failed:
            raise CommandError(f"PAW stopped because {', '.join(failed)} exited unexpectedly.")

    def _stop_children(self, children: dict[str, subprocess.Popen], grace: float) -> None:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, child in children.items():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self._say(f"PAW: {name} did not stop within {grace:.0f} s; killing it.", error=True)
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        self._say("PAW stopped.")
