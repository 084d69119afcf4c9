"""Helpers shared by the planning tools: the user-error type, number-list parsing, plain-text tables,
percentiles and progress reporting on stderr.

Contract: nothing here prints to stdout; progress goes to the stream given (stderr by default).
"""

from __future__ import annotations

import math
import sys
import time
from typing import IO, Iterable, Sequence


class ToolError(Exception):
    """A problem with the user's input (bad option value, missing or malformed file, unknown model).

    The CLI prints the message (no traceback) and exits with status 2.
    """


def parse_count(text: str, what: str, allow_zero: bool = False) -> int:
    """Parses a positive integer that may be written in scientific notation ("1e6", "5e7", "3000").

    Raises:
      ToolError: not a number, not integral, negative, or zero when `allow_zero` is False.
    """
    try:
        value = float(text.strip().replace("_", ""))
    except ValueError:
        raise ToolError(f"{what}: {text!r} is not a number") from None
    if not math.isfinite(value) or value != int(value):
        raise ToolError(f"{what}: {text!r} is not a whole number")
    value = int(value)
    if value < 0 or (value == 0 and not allow_zero):
        raise ToolError(f"{what}: must be {'>= 0' if allow_zero else '> 0'}, got {text!r}")
    return value


def parse_count_list(text: str, what: str) -> list[int]:
    """Parses a comma list of positive counts ("1e4,1e5,1e6"); see `parse_count`."""
    items = [t for t in text.split(",") if t.strip()]
    if not items:
        raise ToolError(f"{what}: empty list")
    return [parse_count(t, what) for t in items]


def parse_positive_float(text: str, what: str) -> float:
    """Parses a finite float > 0."""
    try:
        value = float(text)
    except ValueError:
        raise ToolError(f"{what}: {text!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise ToolError(f"{what}: must be a number > 0, got {text!r}")
    return value


def split_choices(text: str, choices: Sequence[str], what: str) -> list[str]:
    """Splits a comma list and checks every item against `choices` (order kept, duplicates dropped)."""
    out: list[str] = []
    for item in (t.strip().lower() for t in text.split(",")):
        if not item:
            continue
        if item not in choices:
            raise ToolError(f"{what}: unknown {item!r} (choose from {', '.join(choices)})")
        if item not in out:
            out.append(item)
    if not out:
        raise ToolError(f"{what}: empty list")
    return out


def format_table(headers: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """Renders rows as an aligned plain-text table; numbers are right-aligned, text left-aligned."""
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    numeric = [all(_looks_numeric(r[i]) for r in cells[1:]) for i in range(len(headers))]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if n else c.ljust(w) for c, w, n in zip(r, widths, numeric)).rstrip()

    sep = "  ".join("-" * w for w in widths)
    return "\n".join([line(cells[0]), sep] + [line(r) for r in cells[1:]])


def _looks_numeric(cell: str) -> bool:
    text = cell.replace(",", "").replace("%", "").strip()
    if text in ("", "-", "inf"):
        return True
    try:
        float(text.split()[0])
        return True
    except ValueError:
        return False


def human_bytes(n: float) -> str:
    """1536 -> '1.50 KiB' (binary units)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def human_count(n: float | None) -> str:
    """Short token counts for table cells: 10000 -> '1e4', 3000000 -> '3e6', 2500000 -> '2.5e6', None -> 'inf'.
    Exact for integers up to 16 digits (999936 -> '9.99936e5'), so different capacities never share a label."""
    if n is None:
        return "inf"
    if n < 10000:
        return str(int(n))
    mantissa, exponent = f"{n:.15e}".split("e")
    return f"{float(mantissa):g}e{int(exponent)}"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default) of an ascending sequence; NaN when empty."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


class Progress:
    """Progress of one long task on stderr.

    On a terminal it redraws one line ("label  42%") at most 10 times a second; elsewhere (logs, CI) it prints a
    single line when the task finishes. Disabled instances do nothing.
    """

    def __init__(self, label: str, total: int, enabled: bool = True, stream: IO[str] | None = None):
        self.label, self.total, self.enabled = label, max(1, total), enabled
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.start = self._last = time.monotonic()

    def update(self, done: int) -> None:
        if not (self.enabled and self.tty):
            return
        now = time.monotonic()
        if now - self._last >= 0.1:
            self._last = now
            self.stream.write(f"\r{self.label}  {100.0 * done / self.total:5.1f}%")
            self.stream.flush()

    def finish(self, note: str = "") -> None:
        if not self.enabled:
            return
        elapsed = time.monotonic() - self.start
        prefix = "\r" if self.tty else ""
        suffix = f"  {note}" if note else ""
        self.stream.write(f"{prefix}{self.label}  done in {elapsed:.1f} s{suffix}\n")
        self.stream.flush()
