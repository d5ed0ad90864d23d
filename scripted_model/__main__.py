"""``python -m scripted_model --script FILE|NAME --port N [--host 127.0.0.1]
[--no-control]``.

Serves the script until interrupted; prints the base URL (for ``OPENAI_BASE_URL``) on
stdout once listening. ``--script demo`` uses the bundled offline-demo script.
``--no-control`` turns off the unauthenticated ``/_log`` and ``/_script`` endpoints and the
request log: use it whenever other people's sandboxes can reach the server.
"""

from __future__ import annotations

import argparse
import signal
import sys

from scripted_model.script import Script, ScriptError
from scripted_model.server import ScriptedModel


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and serve; returns the exit code (2 on a bad script)."""
    parser = argparse.ArgumentParser(
        prog="python -m scripted_model",
        description="A scripted OpenAI-compatible model server (tests, benchmarks, demo).",
    )
    parser.add_argument(
        "--script", required=True, help="a script file (JSON), or the name of a bundled one: demo"
    )
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--no-control",
        action="store_true",
        help="no /_log or /_script endpoints and no request log (for a shared demo)",
    )
    args = parser.parse_args(argv)
    try:
        script = Script.load(args.script)
    except ScriptError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    model = ScriptedModel(
        script,
        host=args.host,
        port=args.port,
        max_log=0 if args.no_control else None,
        control=not args.no_control,
    )
    # SIGTERM ends serve_forever the same way Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        model.start()
        print(f"scripted model serving {model.base_url}", flush=True)
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        model.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
