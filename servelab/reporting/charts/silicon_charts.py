"""Predicted against measured mean TTFT and TPOT of AIConfigurator's H100 vLLM runs: one
point per row predicted, log-log, colour per model and precision, marker per TP."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from sim.measured.silicon import RowResult, group_key

TP_MARKERS = {1: "s", 2: "o", 4: "^", 8: "D"}


def _kind(result: RowResult) -> tuple[str, str]:
    model, _, precision = group_key(result.row)
    return model, precision


def _panel(ax, results: Sequence[RowResult], metric: str,
           kinds: list[tuple[str, str]]) -> None:
    """One metric's points, the y = x line and a +-25% band."""
    for colour, (model, precision) in enumerate(kinds):
        mine = [r for r in results if _kind(r) == (model, precision)]
        for tp in sorted({r.row.tp for r in mine}):
            points = [r for r in mine if r.row.tp == tp]
            ax.scatter([getattr(r.row, metric) for r in points],
                       [getattr(r, metric) for r in points], s=18, color=f"C{colour}",
                       marker=TP_MARKERS.get(tp, "x"),
                       label=f"{model.split('/')[-1]} {precision} TP{tp}")
    values = [v for r in results for v in (getattr(r.row, metric), getattr(r, metric))]
    lo, hi = min(values) * 0.7, max(values) * 1.4
    ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8)
    for scale in (0.75, 1.25):
        ax.plot([lo, hi], [lo * scale, hi * scale], color="grey", lw=0.5, ls=":")
    name = metric.removesuffix("_ms").upper()
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(lo, hi),
           xlabel=f"measured mean {name} (ms)", ylabel=f"predicted mean {name} (ms)")


def silicon_scatter(results: Sequence[RowResult], path: Path, title: str) -> Path:
    """Both metrics side by side for the rows with a prediction; the chart's path."""
    done = [r for r in results if r.simulated]
    if not done:
        raise ValueError(f"{title}: no row has a prediction to chart")
    kinds = sorted({_kind(r) for r in done})
    fig = Figure(figsize=(12, 5.5), layout="constrained")
    axes = fig.subplots(1, 2)
    _panel(axes[0], done, "ttft_ms", kinds)
    _panel(axes[1], done, "tpot_ms", kinds)
    axes[1].legend(fontsize=7, loc="upper left")
    fig.suptitle(f"{title} ({len(done)} of {len(results)} rows; dotted: +-25%)")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    return path
