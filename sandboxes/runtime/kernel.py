"""The persistent Python process behind ``run_python`` (``python -m
sandboxes.runtime.kernel CTL_IN CTL_OUT``), started by ``kernel_client.PythonKernel``.

Requests arrive as JSON lines on the file descriptor CTL_IN, answers leave on CTL_OUT, so
whatever the user's code prints (or its subprocesses write to fds 1 and 2) is captured per
request through temporary files and never mixes with the control channel. Requests:

- ``{"op": "exec", "code": str}`` → ``{"stdout", "stderr", "error" (traceback or null),
  "figures": [paths], "files": [changed paths]}``
- ``{"op": "preview", "path": str}`` → ``{"stdout": preview text, "error"}`` (a pandas
  preview of a CSV/TSV/XLSX file, in its own namespace)

Variables persist between ``exec`` requests. Open matplotlib figures that the code did not
save are written as ``figure_N.png``. The process kills its group when paw-agent goes away.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import signal
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

MAX_STREAM = 20_000  # characters of stdout / stderr returned per request
MAX_SCAN = 5_000  # workspace entries compared to report changed files
PRIVATE_DIR = ".paw"


def _watch_parent(parent: int) -> None:
    """Kill this process group once paw-agent is gone (it does so itself when alive)."""
    while True:
        time.sleep(0.5)
        if os.getppid() != parent:
            os.killpg(0, signal.SIGKILL)


def _cut(text: str) -> str:
    if len(text) <= MAX_STREAM:
        return text
    half = MAX_STREAM // 2
    return f"{text[:half]}\n… [{len(text) - MAX_STREAM} characters omitted] …\n{text[-half:]}"


def _snapshot() -> dict[str, tuple[int, int]]:
    """``{relative path: (mtime_ns, size)}`` of the workspace files (bounded)."""
    seen: dict[str, tuple[int, int]] = {}
    stack = ["."]
    while stack and len(seen) < MAX_SCAN:
        folder = stack.pop()
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                if entry.name == PRIVATE_DIR or entry.name == "__pycache__":
                    continue
                path = os.path.normpath(os.path.join(folder, entry.name))
                with contextlib.suppress(OSError):
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(path)
                    elif entry.is_file(follow_symlinks=False):
                        info = entry.stat(follow_symlinks=False)
                        seen[path] = (info.st_mtime_ns, info.st_size)
    return seen


def _unique_png(stem: str) -> str:
    n = 1
    while os.path.exists(f"{stem}_{n}.png"):
        n += 1
    return f"{stem}_{n}.png"


def _save_open_figures() -> list[str]:
    """Save the open matplotlib figures no code saved yet as PNG; close them all."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return []
    saved = []
    for number in pyplot.get_fignums():
        figure = pyplot.figure(number)
        if not getattr(figure, "_paw_saved", False):
            path = _unique_png("figure")
            figure.savefig(path, dpi=100)
            saved.append(path)
    pyplot.close("all")
    return saved


def _execute(code: str, namespace: dict[str, Any]) -> str | None:
    """Run ``code`` in ``namespace``; show the value of a final expression like a REPL.
    Returns the traceback text of an exception, else None."""
    try:
        tree = ast.parse(code, filename="<run_python>", mode="exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<run_python>", "exec"), namespace)  # noqa: S102 - the tool's job
        if last is not None:
            value = eval(compile(last, "<run_python>", "eval"), namespace)  # noqa: S307
            if value is not None:
                print(repr(value))
        return None
    except BaseException as exc:  # SystemExit and friends are the code's
        frames = traceback.extract_tb(exc.__traceback__)
        # Drop this module's own frames: the model only needs its code's lines.
        while frames and frames[0].filename == __file__:
            frames.pop(0)
        lines = traceback.format_list(frames) + traceback.format_exception_only(exc)
        return "Traceback (most recent call last):\n" + "".join(lines)


def _preview(path: str) -> str:
    import pandas as pd

    lower = path.lower()
    with pd.option_context("display.width", 160, "display.max_columns", 30):
        if lower.endswith((".xlsx", ".xlsm", ".xls")):
            sheets = pd.read_excel(path, sheet_name=None)
            parts = []
            for name, frame in sheets.items():
                parts.append(f"sheet {name!r}: {_describe(frame)}")
            return "\n\n".join(parts) or "the workbook has no sheets"
        separator = "\t" if lower.endswith((".tsv", ".tab")) else ","
        return _describe(pd.read_csv(path, sep=separator))


def _describe(frame: Any) -> str:
    columns = ", ".join(f"{name} ({dtype})" for name, dtype in frame.dtypes.items())
    return (
        f"{len(frame)} rows x {len(frame.columns)} columns\ncolumns: {columns}\n\n"
        f"first rows:\n{frame.head(20).to_string()}"
    )


def _capture_run(fn: Any) -> dict[str, Any]:
    """Run ``fn()`` with fds 1 and 2 (and sys.stdout/err) pointed at temporary files."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            answer = fn()
        finally:
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
        out.seek(0)
        err.seek(0)
        answer["stdout"] = _cut(answer.get("stdout", "") + out.read().decode("utf-8", "replace"))
        answer["stderr"] = _cut(err.read().decode("utf-8", "replace"))
    return answer


def main() -> None:
    """Serve requests from CTL_IN until it closes (paw-agent stopped the kernel)."""
    ctl_in = os.fdopen(int(sys.argv[1]), "rb")
    ctl_out = os.fdopen(int(sys.argv[2]), "wb")
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True).start()
    # The code runs "in the workspace", importable modules included.
    sys.path.insert(0, os.getcwd())
    # Line-buffered text streams over fds 1 and 2 keep prints in order with subprocesses.
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="replace", closefd=False)  # noqa: SIM115
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    for line in ctl_in:
        request = json.loads(line)
        if request.get("op") == "preview":

            def task(path: str = request["path"]) -> dict[str, Any]:
                try:
                    return {"stdout": _preview(path), "error": None}
                except Exception as exc:  # reported to the model
                    return {"stdout": "", "error": f"{type(exc).__name__}: {exc}"}
        else:

            def task(code: str = request.get("code", "")) -> dict[str, Any]:
                before = _snapshot()
                error = _execute(code, namespace)
                try:
                    figures = _save_open_figures()
                except Exception as exc:  # reported to the model
                    figures = []
                    error = (error or "") + f"\nsaving figures failed: {exc}"
                after = _snapshot()
                changed = sorted(p for p, stamp in after.items() if before.get(p) != stamp)
                return {"error": error, "figures": figures, "files": changed}

        answer = _capture_run(task)
        ctl_out.write(json.dumps(answer).encode() + b"\n")
        ctl_out.flush()


if __name__ == "__main__":
    try:
        main()
    finally:
        # paw-agent closed the channel (or is gone): nothing the code started may stay.
        os.killpg(0, signal.SIGKILL)
