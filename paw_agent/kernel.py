"""The persistent Python process behind ``run_python`` (``python -m
paw_agent.kernel CTL_IN CTL_OUT``), started by ``kernel_client.PythonKernel``.

Requests arrive as JSON lines on the file descriptor CTL_IN, answers leave on CTL_OUT, so
whatever the user's code prints (or its subprocesses write to fds 1 and 2) is captured per
request through temporary files and never mixes with the control channel. Requests:

- ``{"op": "exec", "code": str}`` → ``{"stdout", "stderr", "error" (traceback or null),
  "figures": [paths], "files": [changed paths], "table": {...} or null}``: ``figures``
  the images and Plotly figures this request saved for the code; ``table`` the value of
  a final expression that is a pandas DataFrame or Series, as data (:func:`_table`), and
  ``value`` its text (not printed to ``stdout``)
- ``{"op": "preview", "path": str}`` → ``{"stdout": preview text, "error"}`` (a pandas
  preview of a CSV/TSV/XLSX file, in its own namespace)

Variables persist between ``exec`` requests. Open matplotlib figures that the code did not
save are written as ``figure_N.png``; Plotly figures the code shows (``fig.show()``),
leaves as its final expression or keeps in a new top-level variable without writing them
itself are written as ``figure_N.plotly.json`` (Plotly's JSON: ``{"data", "layout"}``),
with a matplotlib picture of their bar and scatter traces as ``figure_N.png``.
The process kills its group when paw-agent goes away.
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
TABLE_ROWS = 100  # rows of a DataFrame result sent as data
TABLE_COLUMNS = 50  # columns of it
TABLE_VALUE_CAP = 1_000  # characters of one string value in it
TABLE_CAP = 256 * 1024  # characters of its rows as JSON
PLOTLY_SUFFIX = ".plotly.json"


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


def _unique_png(stem: str, suffix: str = ".png") -> str:
    n = 1
    while os.path.exists(f"{stem}_{n}{suffix}") or os.path.exists(f"{stem}_{n}.png"):
        n += 1
    return f"{stem}_{n}{suffix}"


class PlotlyFigures:
    """The Plotly figures of one ``exec`` request that the code did not write itself.

    ``fig.show()`` (and ``plotly.io.show``) save the figure instead of opening a browser;
    the figures written by ``write_json``/``write_html``/``write_image`` are marked so that
    :meth:`save_new` never writes them a second time. The patches are installed once
    ``plotly`` is imported (by the user's code: an import hook, so the kernel's start stays
    fast)."""

    def __init__(self) -> None:
        self.saved: list[str] = []
        self.patched = False

    def install_hook(self) -> None:
        """Patch Plotly as soon as the code imports it."""
        owner = self

        class Finder:
            @staticmethod
            def find_spec(name: str, path: Any = None, target: Any = None) -> Any:
                if name != "plotly.basedatatypes" or owner.patched:
                    return None
                import importlib.machinery

                spec = importlib.machinery.PathFinder.find_spec(name, path)
                if spec is None or spec.loader is None:
                    return None
                loader = spec.loader
                original = loader.exec_module

                def exec_module(module: Any) -> None:
                    original(module)
                    owner.patch(module)

                loader.exec_module = exec_module  # type: ignore[method-assign]
                return spec

        sys.meta_path.insert(0, Finder())

    def patch(self, basedatatypes: Any) -> None:
        """Replace ``BaseFigure.show`` and mark the figures written by the code."""
        self.patched = True
        figure_class = basedatatypes.BaseFigure
        owner = self

        def show(figure: Any, *args: Any, **kwargs: Any) -> None:
            owner.save(figure)

        figure_class.show = show
        for name in ("write_json", "write_html", "write_image"):
            original = getattr(figure_class, name, None)
            if original is None:
                continue

            def written(figure: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
                result = _original(figure, *args, **kwargs)
                with contextlib.suppress(Exception):
                    object.__setattr__(figure, "_paw_saved", True)
                return result

            setattr(figure_class, name, written)

    @staticmethod
    def is_figure(value: Any) -> bool:
        module = sys.modules.get("plotly.basedatatypes")
        return module is not None and isinstance(value, module.BaseFigure)

    def save(self, figure: Any) -> None:
        """Write ``figure`` as ``figure_N.plotly.json`` (once per figure), with its picture
        ``figure_N.png`` when :func:`_plotly_png` can draw it (the page's fallback)."""
        if getattr(figure, "_paw_saved", False):
            return
        path = _unique_png("figure", PLOTLY_SUFFIX)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(figure.to_json())
        object.__setattr__(figure, "_paw_saved", True)
        self.saved.append(path)
        picture = path[: -len(PLOTLY_SUFFIX)] + ".png"
        with contextlib.suppress(Exception):  # no picture is no error: the chart is saved
            if _plotly_png(figure, picture):
                self.saved.append(picture)

    def save_new(self, namespace: dict[str, Any], before: dict[str, int], value: Any) -> None:
        """Save the final expression's figure and the figures bound to top-level names
        that are new or rebound by this request."""
        if self.is_figure(value):
            self.save(value)
        for name, item in list(namespace.items()):
            if self.is_figure(item) and before.get(name) != id(item):
                self.save(item)

    def take(self) -> list[str]:
        """The paths saved since the last call."""
        saved, self.saved = self.saved, []
        return saved


PLOTLY = PlotlyFigures()


def _plotly_png(figure: Any, path: str) -> bool:
    """Draw a Plotly figure's bar and scatter (line, marker) traces with matplotlib into
    ``path`` (PNG, 100 dpi), with its title and axis titles: a picture for where the
    interactive chart cannot be drawn (Plotly's own export needs Kaleido and a browser).
    Returns False, writing nothing, when the figure has no trace of those kinds."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    traces = [t for t in figure.data if getattr(t, "type", "") in ("bar", "scatter", "scattergl")]
    if not traces:
        return False
    picture = Figure(figsize=(6.4, 4.0))
    FigureCanvasAgg(picture)
    axes = picture.add_subplot()
    named = False
    for trace in traces:
        y = list(trace.y) if trace.y is not None else []
        x = list(trace.x) if trace.x is not None else list(range(len(y)))
        label = trace.name or None
        named = named or bool(label)
        if trace.type == "bar":
            if getattr(trace, "orientation", None) == "h":
                axes.barh([str(v) for v in y], x, label=label)
            else:
                axes.bar([str(v) for v in x], y, label=label)
        elif "lines" in (trace.mode or "lines"):
            axes.plot(x, y, marker="o" if "markers" in (trace.mode or "") else None, label=label)
        else:
            axes.scatter(x, y, label=label)
    layout = figure.layout
    title = layout.title.text if layout.title else None
    if title:
        axes.set_title(title)
    if layout.xaxis and layout.xaxis.title and layout.xaxis.title.text:
        axes.set_xlabel(layout.xaxis.title.text)
    if layout.yaxis and layout.yaxis.title and layout.yaxis.title.text:
        axes.set_ylabel(layout.yaxis.title.text)
    if named and len(traces) > 1:
        axes.legend()
    picture.tight_layout()
    picture.savefig(path, dpi=100)
    return True


def _json_value(value: Any) -> Any:
    """A cell of a DataFrame as JSON: numbers stay numbers (NaN and infinities null),
    booleans and None as such, timestamps ISO 8601, bytes ``<N bytes>``, anything else its
    text cut at ``TABLE_VALUE_CAP`` characters."""
    import math

    if value is None or isinstance(value, bool | int | str):
        if isinstance(value, str) and len(value) > TABLE_VALUE_CAP:
            return value[:TABLE_VALUE_CAP] + "…"
        return value
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else value
    if isinstance(value, bytes | bytearray | memoryview):
        return f"<{len(value)} bytes>"
    item = getattr(value, "item", None)  # numpy scalars
    if callable(item) and type(value).__module__ == "numpy":
        with contextlib.suppress(Exception):
            return _json_value(item())
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        with contextlib.suppress(Exception):
            if str(value) in ("NaT", "nan"):
                return None
            return isoformat()
    text = str(value)
    if text in ("nan", "NaT", "<NA>"):
        return None
    return text if len(text) <= TABLE_VALUE_CAP else text[:TABLE_VALUE_CAP] + "…"


def _tabular(value: Any) -> bool:
    """Whether ``value`` is a pandas DataFrame or Series (shown to people as a table)."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(value, pandas.DataFrame | pandas.Series)


def _table(value: Any) -> dict[str, Any] | None:
    """A pandas DataFrame (or Series) as ``{"columns": [str], "rows": [[JSON values]] (the
    first ``TABLE_ROWS``, within ``TABLE_CAP`` characters), "row_count", "truncated"}``; an
    index that is not the default 0…n-1 becomes the first column(s). None for any other
    value (or when pandas is not loaded)."""
    pandas = sys.modules.get("pandas")
    if pandas is None:
        return None
    if isinstance(value, pandas.Series):
        value = value.to_frame(name=value.name if value.name is not None else "value")
    if not isinstance(value, pandas.DataFrame):
        return None
    frame = value
    index = frame.index
    default_index = isinstance(index, pandas.RangeIndex) and index.start == 0 and index.step == 1
    if not default_index:
        with contextlib.suppress(Exception):
            frame = frame.reset_index()
    frame = frame.iloc[:, :TABLE_COLUMNS]
    columns = [
        " / ".join(str(part) for part in c) if isinstance(c, tuple) else str(c)
        for c in frame.columns
    ]
    rows, size = [], 0
    for row in frame.head(TABLE_ROWS).itertuples(index=False, name=None):
        values = [_json_value(v) for v in row]
        size += len(json.dumps(values, ensure_ascii=False, default=str))
        if size > TABLE_CAP:
            break
        rows.append(values)
    return {
        "columns": columns,
        "rows": rows,
        "row_count": len(frame),
        "truncated": len(rows) < len(frame) or len(value.columns) > TABLE_COLUMNS,
    }


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


def _execute(code: str, namespace: dict[str, Any]) -> tuple[str | None, Any]:
    """Run ``code`` in ``namespace``; show the value of a final expression like a REPL.
    Returns the traceback text of an exception (else None) and the final expression's
    value (else None)."""
    value = None
    try:
        tree = ast.parse(code, filename="<run_python>", mode="exec")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        exec(compile(tree, "<run_python>", "exec"), namespace)  # noqa: S102 - the tool's job
        if last is not None:
            value = eval(compile(last, "<run_python>", "eval"), namespace)  # noqa: S307
            if value is not None and not _tabular(value):
                print(repr(value))
        return None, value
    except BaseException as exc:  # SystemExit and friends are the code's
        frames = traceback.extract_tb(exc.__traceback__)
        # Drop this module's own frames: the model only needs its code's lines.
        while frames and frames[0].filename == __file__:
            frames.pop(0)
        lines = traceback.format_list(frames) + traceback.format_exception_only(exc)
        return "Traceback (most recent call last):\n" + "".join(lines), value


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
    PLOTLY.install_hook()
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
                names = {name: id(item) for name, item in namespace.items()}
                PLOTLY.take()
                error, value = _execute(code, namespace)
                try:
                    figures = _save_open_figures()
                    PLOTLY.save_new(namespace, names, value)
                except Exception as exc:  # reported to the model
                    figures = []
                    error = (error or "") + f"\nsaving figures failed: {exc}"
                figures += PLOTLY.take()
                table, shown = None, None
                if _tabular(value):
                    # Its text goes to the model apart from stdout ("value"): people get
                    # the table instead.
                    shown = _cut(repr(value))
                    try:
                        table = _table(value)
                    except Exception:  # a table nobody can read is just not shown as one
                        table = None
                after = _snapshot()
                changed = sorted(p for p, stamp in after.items() if before.get(p) != stamp)
                return {
                    "error": error,
                    "figures": figures,
                    "files": changed,
                    "table": table,
                    "value": shown,
                }

        answer = _capture_run(task)
        ctl_out.write(json.dumps(answer).encode() + b"\n")
        ctl_out.flush()


if __name__ == "__main__":
    try:
        main()
    finally:
        # paw-agent closed the channel (or is gone): nothing the code started may stay.
        os.killpg(0, signal.SIGKILL)
