"""The timeline chart of a run per policy: batch size, waiting queue, KV usage and step time
against time, each reduced over time bins so a million steps draw as a few thousand points.

Step times jump by orders between decode steps and long prefills: that panel shows each
bin's mean as the line (coarser bins, so it reads as a trend) and its maximum as a faint
line of the same colour behind it.
"""

from __future__ import annotations

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from servelab.reporting.charts.series import (
    SeriesStyle,
    extremes,
    heading,
    identical_to,
    log_scale,
    with_twin,
)
from sim.policy_runs import RunTables

TIMELINE_BINS = 2000  # time bins of the timeline: bounds points per line
STEP_TIME_BINS = 200  # coarser bins of the step-time panel: a trend, not a comb

def _binned(
    start_s: np.ndarray,
    columns: dict[str, np.ndarray],
    edges_s: np.ndarray,
    reducers: dict[str, str],
) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """Reduce each column per time bin (mean or max) over the steps starting in that bin.

    Returns the centres of the non-empty bins (s) and one value per such bin and column;
    O(num_steps) via ufunc.reduceat on the time-sorted steps.
    """
    order = np.argsort(start_s, kind="stable")
    bins = np.clip(np.searchsorted(edges_s, start_s[order], side="right") - 1, 0, edges_s.size - 2)
    firsts = np.flatnonzero(np.diff(bins, prepend=-1))  # first step of each non-empty bin
    counts = np.diff(np.append(firsts, bins.size))
    centres_s = (edges_s[bins[firsts]] + edges_s[bins[firsts] + 1]) / 2
    out = {}
    for key, values in columns.items():
        values = values[order]
        if reducers[key] == "max":
            out[key] = np.maximum.reduceat(values, firsts)
        else:
            out[key] = np.add.reduceat(values, firsts) / counts
    return centres_s, out


_TIMELINE_PANELS = (  # (column, reducer, y label); step time is drawn by _step_panel
    ("batch_size", "mean", "batch size (rows, mean)"),
    ("num_waiting", "mean", "waiting queue (requests, mean)"),
    ("kv_pct", "mean", "KV usage (% of blocks, mean)"),
)
_REDUCERS = {"batch_size": "mean", "num_waiting": "mean", "kv_pct": "mean", "step_ms": "mean",
             "step_max_ms": "max"}


def _timeline_columns(run: RunTables) -> dict[str, np.ndarray]:
    steps = run.steps
    return {
        "batch_size": steps["batch_size"].to_numpy(dtype=float),
        "num_waiting": steps["num_waiting"].to_numpy(dtype=float),
        "kv_pct": steps["kv_blocks_used"].to_numpy(dtype=float) * 100.0 / run.num_blocks,
        "step_ms": steps["duration_s"].to_numpy(dtype=float) * 1e3,
        "step_max_ms": steps["duration_s"].to_numpy(dtype=float) * 1e3,
    }


def _time_edges_s(runs: dict[str, RunTables], bins: int) -> np.ndarray:
    """bins + 1 bin edges (s) from the first step start to the last step end.

    One grid for every policy, so the bins line up across lines.
    """
    busy = [run.steps for run in runs.values() if len(run.steps)]
    t0_s = min(float(steps["start_s"].min()) for steps in busy)
    t1_s = max(float((steps["start_s"] + steps["duration_s"]).max()) for steps in busy)
    return np.linspace(t0_s, max(t1_s, t0_s + 1e-9), bins + 1)


def timeline_chart(runs: dict[str, RunTables], styles: dict[str, SeriesStyle],
                   title: str) -> Figure:
    """The four panels, one line per policy; a policy whose steps equal an earlier one's
    says so in the legend."""
    fig = Figure(figsize=(11, 10), layout="constrained")
    axes = fig.subplots(len(_TIMELINE_PANELS) + 1, 1, sharex=True)
    busy = any(len(run.steps) for run in runs.values())
    edges_s = _time_edges_s(runs, TIMELINE_BINS) if busy else None
    coarse_s = _time_edges_s(runs, STEP_TIME_BINS) if busy else None
    twins = identical_to({name: _timeline_columns(run)["step_ms"] for name, run in
                          runs.items()})
    for name, run in runs.items():
        style = styles[name]
        label = with_twin(name, name, twins)
        if edges_s is None or not len(run.steps):
            axes[0].plot([], [], color=style.color, label=f"{name} (no steps)")
            continue
        start_s = run.steps["start_s"].to_numpy(dtype=float)
        columns = _timeline_columns(run)
        centres_s, binned = _binned(start_s, columns, edges_s, _REDUCERS)
        for ax, (column, _, _) in zip(axes[:-1], _TIMELINE_PANELS, strict=True):
            ax.plot(centres_s, binned[column], linewidth=1, label=label if ax is axes[0]
                    else None, **style.line(centres_s.size))
        _step_panel(axes[-1], start_s, columns, coarse_s, style)
    _label_panels(axes, busy)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncols=min(len(runs), 4))
    peaks = {name: float(run.steps["num_waiting"].max()) if len(run.steps) else None
             for name, run in runs.items()}
    finding = (extremes(peaks, "peak waiting queue", lambda v: f"{v:,.0f} requests", True)
               if any(peaks.values()) else "no request ever waited for admission")
    what = f"Scheduler state over time ({TIMELINE_BINS} time bins)"
    fig.suptitle(heading(finding, what, title), x=0.02, ha="left", fontsize=11)
    return fig


def _step_panel(ax: Axes, start_s: np.ndarray, columns: dict[str, np.ndarray],
                edges_s: np.ndarray, style: SeriesStyle) -> None:
    """Mean step time per coarse bin as the line, the bin's longest step faint behind it."""
    centres_s, binned = _binned(start_s, {k: columns[k] for k in ("step_ms", "step_max_ms")},
                                edges_s, _REDUCERS)
    ax.plot(centres_s, binned["step_max_ms"], color=style.color, linewidth=0.6, alpha=0.3)
    ax.plot(centres_s, binned["step_ms"], linewidth=1.2, **style.line(centres_s.size))


def _label_panels(axes: np.ndarray, busy: bool) -> None:
    for ax, (_, _, ylabel) in zip(axes[:-1], _TIMELINE_PANELS, strict=True):
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[2].set_ylim(0, 105)
    axes[-1].set_ylabel(f"step time (ms, log;\nmean over {STEP_TIME_BINS} bins,\nfaint: max)")
    axes[-1].grid(True, which="both", alpha=0.3)
    if busy and any(line.get_ydata().size for line in axes[-1].get_lines()):
        log_scale(axes[-1], "y")  # prefill spikes and decode steps differ by orders
    axes[-1].set_xlabel("time (s)")
