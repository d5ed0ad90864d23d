"""``manage.py runpaw``: start the whole product (what ``make run`` calls after migrating).

Embedded mode (``PAW_REDIS_URL`` empty): one process runs Daphne, a Celery worker thread
on an in-memory broker, and Celery beat in a thread. With ``PAW_REDIS_URL`` set: Daphne,
a Celery worker node and Celery beat run as child processes; Ctrl-C (or SIGTERM) stops
them all, each given ``--grace`` seconds before it is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandParser

from paw_project.embedded import node_queues


class Command(BaseCommand):
    help = "Start PAW: web server, Celery worker and beat (embedded or as child processes)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--host", default=settings.PAW_HOST)
        parser.add_argument("--port", type=int, default=settings.PAW_PORT)
        parser.add_argument(
            "--grace", type=float, default=30.0, help="seconds a child gets to stop (default 30)"
        )

    def handle(self, *args, host: str, port: int, grace: float, **options) -> None:
        url = f"http://{'localhost' if host in ('127.0.0.1', '0.0.0.0') else host}:{port}/"  # noqa: S104
        mode = "embedded (one process, no Redis)" if settings.EMBEDDED else "Redis"
        self.stdout.write(
            f"PAW is starting in {mode} mode.\n"
            f"  Open {url}  (admin: {url}admin/, API docs: {url}api/docs/)\n"
            "  Stop with Ctrl-C.",
        )
        self.stdout.flush()
        if settings.EMBEDDED:
            self._run_embedded(host, port)
        else:
            self._run_children(host, port, grace)

    def _run_embedded(self, host: str, port: int) -> None:
        from daphne.server import Server

        from paw_project.asgi import application
        from paw_project.embedded import EmbeddedWorker

        worker = EmbeddedWorker()
        worker.start()
        try:
            Server(
                application=application,
                endpoints=[f"tcp:port={port}:interface={host}"],
                signal_handlers=True,
                action_logger=None,
            ).run()
        finally:
            self.stdout.write("PAW is stopping…")
            worker.stop()

    def _run_children(self, host: str, port: int, grace: float) -> None:
        python = sys.executable
        node = settings.PAW_NODE_NAME
        commands = {
            "web": [
                python,
                "-m",
                "daphne",
                "-b",
                host,
                "-p",
                str(port),
                "paw_project.asgi:application",
            ],
            "worker": [
                python,
                "-m",
                "celery",
                "-A",
                "paw_project",
                "worker",
                "--pool",
                "threads",
                "--concurrency",
                str(settings.PAW_WORKER_CONCURRENCY),
                "-n",
                f"paw@{node}",
                "-Q",
                ",".join(node_queues(node)),
                "--loglevel",
                settings.PAW_LOG_LEVEL,
            ],
            "beat": [
                python,
                "-m",
                "celery",
                "-A",
                "paw_project",
                "beat",
                "--loglevel",
                settings.PAW_LOG_LEVEL,
            ],
        }
        children: dict[str, subprocess.Popen] = {}
        stopping = False

        def request_stop(signum: int, frame: object) -> None:
            nonlocal stopping
            stopping = True

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)
        try:
            for name, command in commands.items():
                # Own sessions: a terminal's Ctrl-C reaches only us, and we stop each in turn.
                children[name] = subprocess.Popen(command, start_new_session=True)
            while not stopping:
                exited = {
                    name: child.poll()
                    for name, child in children.items()
                    if child.poll() is not None
                }
                if exited:
                    self.stderr.write(
                        f"PAW: {', '.join(exited)} exited ({exited}); stopping the rest."
                    )
                    break
                time.sleep(0.5)
        finally:
            self._stop_children(children, grace)

    def _stop_children(self, children: dict[str, subprocess.Popen], grace: float) -> None:
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for name, child in children.items():
            try:
                child.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stderr.write(f"PAW: {name} did not stop within {grace:.0f} s; killing it.")
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
        self.stdout.write("PAW stopped.")
