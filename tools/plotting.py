"""Matplotlib helpers for the planning tools: headless (Agg) figures saved to PNG/SVG/PDF files.

matplotlib is imported only when a plot is requested, so the rest of the tools start fast; it is an optional
dependency (the wheel's `plot` extra), so its absence is a user error, not a traceback.
"""

from __future__ import annotations

import os

from .common import ToolError


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        raise ToolError("--plot needs matplotlib (pip install matplotlib, or the wheel's [plot] extra)") from None
    matplotlib.use("Agg")
    return matplotlib


def check_plot_target(path: str) -> None:
    """Fails fast, before a long simulation, when the plot could not be written: matplotlib missing, an
    extension matplotlib cannot write, or a folder that does not exist.

    Raises:
      ToolError: as above.
    """
    _matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    ext = os.path.splitext(path)[1].lstrip(".").lower()
    formats = FigureCanvasBase.get_supported_filetypes()
    if ext not in formats:
        raise ToolError(f"cannot write plot {path}: unknown image format {ext!r} "
                        f"(use one of {', '.join(sorted(formats))})")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ToolError(f"cannot write plot {path}: no folder {folder}")


def new_figure(width: float = 7.0, height: float = 4.5):
    """Returns (figure, axes) on the non-interactive Agg backend."""
    _matplotlib()
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=120)
    return fig, fig.add_subplot(1, 1, 1)


def save_figure(fig, path: str) -> None:
    """Writes the figure; the format follows the file extension.

    Raises:
      ToolError: the file cannot be written or the extension is not a known image format.
    """
    fig.tight_layout()
    try:
        fig.savefig(path)
    except (OSError, ValueError) as e:
        raise ToolError(f"cannot write plot {path}: {e}") from None
