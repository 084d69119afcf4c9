"""Matplotlib helpers for the planning tools: headless (Agg) figures saved to PNG/SVG/PDF files.

matplotlib is imported only when a plot is requested, so the rest of the tools start fast.
"""

from __future__ import annotations

from .common import ToolError


def new_figure(width: float = 7.0, height: float = 4.5):
    """Returns (figure, axes) on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
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
