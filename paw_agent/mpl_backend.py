"""A matplotlib backend for ``run_python`` (``MPLBACKEND=module://paw_agent.mpl_backend``).

The Agg backend (PNG, no display), plus a mark on every figure that was saved by the code
itself, so the kernel only auto-saves the figures nobody saved (no duplicates), and
``plt.show()`` saves instead of warning that it cannot show.
Backend interface: https://matplotlib.org/stable/users/explain/figure/backends.html
"""

from __future__ import annotations

from typing import Any

from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg


class FigureCanvas(FigureCanvasAgg):
    """Agg canvas that marks its figure as saved whenever it is printed to a file."""

    def print_figure(self, *args: Any, **kwargs: Any) -> Any:
        """Save as Agg does, then mark the figure (``figure._paw_saved = True``)."""
        result = super().print_figure(*args, **kwargs)
        self.figure._paw_saved = True
        return result


FigureManager = FigureManagerBase


def show(*args: Any, **kwargs: Any) -> None:
    """``plt.show()``: figures are saved as PNG when the code finishes, nothing to show."""
