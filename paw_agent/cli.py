"""The ``paw-agent`` command: ``paw-agent serve [flags]`` speaks the serve protocol v1 on
stdin/stdout (PROTOCOL.md). Flags mirror python-agent-harness's ``serve`` where they
overlap (``--project``, ``--answer-timeout``, ``--max-rounds``, ``--timeout``,
``--no-stream``); times are seconds, 0 = no limit.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def build_parser() -> argparse.ArgumentParser:
    """The command-line parser (``serve`` is the only command)."""
    parser = argparse.ArgumentParser(
        prog="paw-agent",
        description=(
            "PAW's agent runtime. Configure the model with OPENAI_BASE_URL, OPENAI_API_KEY and "
            "OPENAI_MODEL; datasources with PAW_DATASOURCES and PAW_DATASOURCE_<SLUG>_URL."
        ),
    )
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve", help="serve the protocol on stdin/stdout")
    serve.add_argument("--project", default=".", help="the workspace folder (default: cwd)")
    serve.add_argument(
        "--secrets-fd",
        type=int,
        default=None,
        metavar="FD",
        help="read more environment variables (a JSON object) from this pipe: the provider "
        "key and datasource URLs, kept out of /proc/<pid>/environ",
    )
    serve.add_argument(
        "--answer-timeout",
        type=float,
        default=0.0,
        metavar="S",
        help="how long a question or approval waits (0 = forever); unanswered = declined",
    )
    serve.add_argument(
        "--max-rounds", type=int, default=10, metavar="N", help="tool rounds per run (default 10)"
    )
    serve.add_argument(
        "--timeout", type=float, default=0.0, metavar="S", help="wall clock per run (0 = none)"
    )
    serve.add_argument(
        "--max-output-tokens",
        type=int,
        default=4096,
        metavar="N",
        help="model output tokens per call (default 4096)",
    )
    serve.add_argument(
        "--context-budget",
        type=int,
        default=100_000,
        metavar="N",
        help="tokens per model request (default 100000)",
    )
    serve.add_argument(
        "--memory-turns",
        type=int,
        default=12,
        metavar="N",
        help="earlier turns remembered (default 12)",
    )
    serve.add_argument(
        "--tool-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="time limit of one tool call (default 120)",
    )
    serve.add_argument(
        "--sql-result-rows",
        type=int,
        default=100,
        metavar="N",
        help="rows of a run_sql result sent to the host as data (default 100)",
    )
    serve.add_argument(
        "--sql-retries",
        type=int,
        default=2,
        metavar="N",
        help="statements per run that the check before run_sql (parsed, then EXPLAINed) "
        "sends back to the model instead of running them; then they run unchecked "
        "(default 2, 0: no check)",
    )
    serve.add_argument(
        "--sql-check-timeout",
        type=float,
        default=5.0,
        metavar="S",
        help="time limit of that check's EXPLAIN; a slower one lets the statement run "
        "unchecked (default 5)",
    )
    serve.add_argument(
        "--max-image-bytes",
        type=int,
        default=20 * 1024 * 1024,
        metavar="N",
        help="largest image sent to the model, attached or by view_image (default 20 MiB)",
    )
    serve.add_argument(
        "--packages-dir",
        default=None,
        metavar="DIR",
        help="where install_package installs (default PROJECT/.paw/site-packages)",
    )
    serve.add_argument(
        "--retries",
        type=int,
        default=3,
        metavar="N",
        help="retries of a failed model call (default 3)",
    )
    serve.add_argument(
        "--retry-base",
        type=float,
        default=0.5,
        metavar="S",
        help="first retry delay, doubled each time (default 0.5)",
    )
    serve.add_argument(
        "--delta-window",
        type=float,
        default=3.0,
        metavar="MS",
        help="streamed pieces closer together than this share one delta line; a slower "
        "stream gets a line per piece at once (default 3, 0: a line per piece)",
    )
    serve.add_argument(
        "--no-stream",
        action="store_true",
        help="ask the model for whole answers instead of streams",
    )
    serve.add_argument(
        "--no-warm",
        action="store_true",
        help="import the model SDK on the first model call, not right after ready "
        "(about 17 MB less for a sandbox that never runs; its first answer comes ~0.2-0.5 s "
        "later)",
    )
    serve.add_argument(
        "--spare",
        action="store_true",
        help="start as a spare, before any conversation needs it: the SDK is imported at "
        "once, and the environment of --secrets-fd (required) and the workspace come "
        "with the handover op, not at start",
    )
    return parser


PR_SET_DUMPABLE = 4  # <linux/prctl.h>


def keep_memory_private() -> bool:
    """Make this process non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``, Linux): its
    ``/proc/<pid>/environ`` and memory can then not be read by the tools it runs, which
    share its user but, in PAW's jail, have no capabilities (``ptrace_may_access``,
    proc(5)). Its environment holds the provider key and the datasource URLs, which the
    tools are not given. Children are dumpable again after their ``execve``, which is
    fine: they never get those values. Returns whether it took effect."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def main(argv: list[str] | None = None) -> int:
    """Run ``paw-agent``; ``serve`` ends the process itself (exit code 0)."""
    args = build_parser().parse_args(argv)
    if not keep_memory_private():
        print("paw-agent: could not make its memory private (prctl)", file=sys.stderr)
    from paw_agent.procs import become_subreaper
    from paw_agent.secrets_pipe import read_secrets

    if not become_subreaper():
        print("paw-agent: could not become a child subreaper (prctl)", file=sys.stderr)
    if args.spare and args.secrets_fd is None:
        print("paw-agent: --spare needs --secrets-fd (read at the hand-over)", file=sys.stderr)
        return 2
    if args.secrets_fd is not None and not args.spare:
        try:
            os.environ.update(read_secrets(args.secrets_fd))
        except (OSError, ValueError) as exc:
            print(f"paw-agent: cannot read --secrets-fd {args.secrets_fd}: {exc}", file=sys.stderr)
            return 2
    # The protocol gets its own copy of stdout; fd 1 then points at stderr, so a stray
    # print (ours or a library's) can never corrupt the JSON lines.
    protocol_fd = os.dup(1)
    os.dup2(2, 1)
    from paw_agent.agent import Agent, Settings
    from paw_agent.protocol import LineWriter
    from paw_agent.server import AgentServer

    settings = Settings(
        project=Path(args.project),
        answer_timeout=max(0.0, args.answer_timeout),
        max_rounds=max(0, args.max_rounds),
        timeout=max(0.0, args.timeout),
        max_output_tokens=max(1, args.max_output_tokens),
        context_budget=max(1, args.context_budget),
        memory_turns=max(0, args.memory_turns),
        stream=not args.no_stream,
        tool_timeout=max(1.0, args.tool_timeout),
        packages_dir=Path(args.packages_dir).resolve() if args.packages_dir else None,
        attempts=max(0, args.retries) + 1,
        retry_base=max(0.0, args.retry_base),
        sql_result_rows=max(0, args.sql_result_rows),
        sql_retries=max(0, args.sql_retries),
        sql_check_timeout=max(0.1, args.sql_check_timeout),
        max_image_bytes=max(1, args.max_image_bytes),
        warm=not args.no_warm,
        delta_window=max(0.0, args.delta_window) / 1000,
    )
    try:
        agent = Agent(settings, os.environ)
    except FileNotFoundError as exc:
        print(f"paw-agent: {exc}", file=sys.stderr)
        return 2
    spare_fd = args.secrets_fd if args.spare else None
    code = AgentServer(agent, LineWriter(protocol_fd), spare_fd=spare_fd).serve()
    sys.stderr.flush()
    # Daemon threads may sit in blocking reads; leaving without interpreter teardown
    # avoids waiting on (or crashing in) them. Every line was written unbuffered.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
