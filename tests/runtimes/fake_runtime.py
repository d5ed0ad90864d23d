"""A deliberately misbehaving runtime for host tests: ``python fake_runtime.py serve``.

The mode is read from the file ``fake_mode`` in the working directory (the conversation's
workspace), so one worker serves every mode. Modes:
- ``bad-version``: announces protocol version 99.
- ``silent``: never says ``ready``.
- ``garbage``: on submit writes start, then lines a host must survive (not JSON, a JSON
  array, no type, an unknown type, a seq gap, a foreign run_id, an over-long line), then
  a proper result.
- ``die``: on submit writes start and a delta, then exits with code 3 (stderr "boom").
- ``flood N``: on submit writes N numbered deltas as fast as it can, then the result.
Speaks just enough of protocol v1 (PROTOCOL.md) for that.
"""

from __future__ import annotations

import json
import os
import sys


def out(obj: dict) -> None:
    sys.stdout.write(json.dumps({**obj, "protocol": 1}) + "\n")
    sys.stdout.flush()


def main() -> None:
    try:
        with open("fake_mode") as f:
            words = f.read().split()
    except FileNotFoundError:
        words = ["garbage"]
    mode = words[0]
    if mode == "silent":
        sys.stdin.read()
        return
    version = 99 if mode == "bad-version" else 1
    out(
        {
            "type": "ready",
            "pid": os.getpid(),
            "protocol_version": version,
            "capabilities": ["submit"],
        }
    )
    for raw in sys.stdin:
        op = json.loads(raw)
        if op.get("op") == "shutdown":
            return
        if op.get("op") != "submit":
            continue
        run_id = op["run_id"]
        out({"seq": 1, "type": "start", "prompt": op["prompt"], "run_id": run_id})
        if mode == "garbage":
            sys.stdout.write("this is not json\n")
            sys.stdout.write("[1, 2, 3]\n")
            sys.stdout.write('{"no_type": true}\n')
            out({"seq": 2, "type": "mystery", "run_id": run_id, "x": 1})
            out({"seq": 5, "type": "delta", "text": "after a gap", "run_id": run_id})
            out({"seq": 6, "type": "delta", "text": "foreign", "run_id": "someone-else"})
            sys.stdout.write("x" * (5 * 1024 * 1024) + "\n")
            out(
                {
                    "seq": 8,
                    "type": "result",
                    "answer": "survived",
                    "errors": [],
                    "error_messages": [],
                    "cancelled": False,
                    "model": "fake",
                    "usage": {"input": 1, "output": 1, "rounds": 1},
                    "run_id": run_id,
                }
            )
        elif mode == "die":
            out({"seq": 2, "type": "delta", "text": "about to die", "run_id": run_id})
            sys.stderr.write("boom\n")
            sys.stderr.flush()
            os._exit(3)
        elif mode == "flood":
            count = int(words[1])
            for n in range(1, count + 1):
                out({"seq": n + 1, "type": "delta", "text": f"{n} ", "run_id": run_id})
            out(
                {
                    "seq": count + 2,
                    "type": "result",
                    "answer": f"sent {count}",
                    "errors": [],
                    "error_messages": [],
                    "cancelled": False,
                    "model": "fake",
                    "usage": {"input": 1, "output": count, "rounds": 1},
                    "run_id": run_id,
                }
            )


if __name__ == "__main__":
    main()
