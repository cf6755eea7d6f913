"""What every per-policy chart shares: a distinct look per policy, identical series noted,
and a few words of finding for the title.

Two policies can produce the same numbers (continuous and recompute when nothing is
preempted): drawn in colour alone, the later line hides the earlier. Each policy gets its
own colour, dash pattern and marker, and a series equal to an earlier one says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.ticker import FuncFormatter, LogFormatter

_DASHES = ("-", "--", "-.", ":")
_MARKERS = ("o", "s", "^", "D", "v", "P")
MARKS_PER_LINE = 12  # markers along one line: enough to tell it, few enough to read


@dataclass(frozen=True)
class SeriesStyle:
    """How one policy's lines are drawn."""

    color: str
    linestyle: str
    marker: str

    def line(self, num_points: int) -> dict:
        """Keyword arguments for Axes.plot of a line of num_points points."""
        return {"color": self.color, "linestyle": self.linestyle, "marker": self.marker,
                "markevery": max(1, num_points // MARKS_PER_LINE), "markersize": 4}


def series_styles(names: list[str]) -> dict[str, SeriesStyle]:
    """One colour, dash pattern and marker per name, in order."""
    return {name: SeriesStyle(f"C{i % 10}", _DASHES[i % len(_DASHES)],
                              _MARKERS[i % len(_MARKERS)]) for i, name in enumerate(names)}


def identical_to(values: dict[str, np.ndarray]) -> dict[str, str]:
    """name -> the first earlier name whose values are exactly equal (NaNs equal too)."""
    twins: dict[str, str] = {}
    seen: list[str] = []
    for name, array in values.items():
        twin = next((other for other in seen
                     if np.array_equal(values[other], array, equal_nan=True)), None)
        if twin is not None:
            twins[name] = twin
        seen.append(name)
    return twins


def with_twin(label: str, name: str, twins: dict[str, str]) -> str:
    """A legend label, noting the earlier series this one is identical to."""
    return f"{label}, identical to {twins[name]}" if name in twins else label


def ms_text(value_ms: float) -> str:
    """31 ms, 1.2 s, 298 s: a latency in a few characters."""
    if value_ms < 1000:
        return f"{value_ms:.3g} ms"
    return f"{value_ms / 1e3:.2g} s" if value_ms < 10_000 else f"{value_ms / 1e3:,.0f} s"


def extremes(values: dict[str, float | None], what: str, text, low_is_best: bool) -> str:
    """`p99 ITL: best chunked (60 ms), worst static (1.2 s)`: the finding in a few words;
    policies whose values read the same share a place."""
    known = {name: v for name, v in values.items() if v is not None and np.isfinite(v)}
    if not known:
        return f"no {what}"
    pick = min if low_is_best else max
    best_text = text(pick(known.values()))
    worst_text = text((max if low_is_best else min)(known.values()))
    if best_text == worst_text:
        alike = "" if len(known) == 1 else " (every policy)"
        return f"{what}: {best_text}{alike}"
    best = ", ".join(name for name, v in known.items() if text(v) == best_text)
    worst = ", ".join(name for name, v in known.items() if text(v) == worst_text)
    return f"{what}: best {best} ({best_text}), worst {worst} ({worst_text})"


def heading(finding: str, what: str, title: str) -> str:
    """The finding on the first line; what is drawn, and of which run, on the second."""
    return f"{finding}\n{what} \u00b7 {title}" if title else f"{finding}\n{what}"


def log_scale(ax: Axes, which: str) -> None:
    """Log-scale the x or y axis with plain labels (10, 200, 1,000): readable at any span.

    Call it only once the axis shows data: an empty log axis cannot place ticks.
    """
    if which == "x":
        ax.set_xscale("log")
        axis = ax.xaxis
    else:
        ax.set_yscale("log")
        axis = ax.yaxis
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1 else f"{v:g}"))
    axis.set_minor_formatter(LogFormatter(labelOnlyBase=False, minor_thresholds=(2, 0.5)))
