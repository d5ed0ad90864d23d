"""The web server: Daphne serving ``paw_project.asgi``, as ``runpaw`` starts it.

``python -m paw_project.web --host H --port P`` is the web process of the Redis mode;
the embedded mode calls :func:`serve` in its own process. Unlike the ``daphne`` command
line, this writes nothing to stdout itself (access lines go through logging, see
``paw_project.access_log``) and exits 1 when it cannot listen.
"""

from __future__ import annotations

import argparse
import os
import sys


def serve(host: str, port: int) -> bool:
    """Serve until SIGINT or SIGTERM. Returns ``False`` when Daphne could not listen on
    ``host:port`` (it logs why)."""
    from daphne.endpoints import build_endpoint_description_strings
    from daphne.server import Server

    from paw_project.asgi import application

    server = Server(
        application=application,
        endpoints=build_endpoint_description_strings(host=host, port=port),
        signal_handlers=True,
        action_logger=None,
    )
    server.run()
    return bool(server.listening_addresses)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "paw_project.settings")
    return 0 if serve(args.host, args.port) else 1


if __name__ == "__main__":
    sys.exit(main())
