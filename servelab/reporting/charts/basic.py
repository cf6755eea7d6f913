"""Charts of a run per policy (`--out DIR`): TTFT and ITL CDFs,
throughput and latency bars, and a timeline of batch size, queue, KV usage and step time.
Reads finished result tables only; draws on `matplotlib.figure.Figure` (no pyplot state).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogFormatter

from sim.policy_runs import RunTables

CDF_BINS = 2000  # log-spaced bins per CDF curve: O(n) for millions of ITLs
TIMELINE_BINS = 2000  # time bins of the timeline: bounds points per line
DPI = 110
_DONE = ("length", "stop")
# (summary key, bar label) of the latency panel.
_LATENCY_BARS = (
    ("median_ttft_ms", "TTFT p50"),
    ("p95_ttft_ms", "TTFT p95"),
    ("p99_ttft_ms", "TTFT p99"),
    ("median_itl_ms", "ITL p50"),
    ("p99_itl_ms", "ITL p99"),
)


def write_run_outputs(runs: dict[str, RunTables], out_dir: Path, title: str,
                      replicas: dict[str, pd.DataFrame] | None = None) -> tuple[int, int]:
    """`--out DIR` of a run per policy: requests_P.csv, steps_P.parquet, replicas_P.csv for a
    cluster, and the charts; returns (charts, tables) written."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tables = 0
    for policy, run in runs.items():
        run.requests.to_csv(out_dir / f"requests_{policy}.csv", index=False)
        run.steps.to_parquet(out_dir / f"steps_{policy}.parquet", index=False)
        tables += 2
        if replicas and replicas.get(policy) is not None:
            replicas[policy].to_csv(out_dir / f"replicas_{policy}.csv", index=False)
            tables += 1
    return len(write_charts(runs, out_dir, title)), tables


def write_charts(runs: dict[str, RunTables], out_dir: Path, title: str) -> list[Path]:
    """Write the four chart PNGs for runs (policy -> tables) into out_dir; return their paths."""
    if not runs:
        raise ValueError("write_charts: no runs to plot")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    colors = {name: f"C{i % 10}" for i, name in enumerate(runs)}  # one colour per policy
    figures = {
        "ttft_cdf.png": _ttft_cdf(runs, colors, title),
        "itl_cdf.png": _itl_cdf(runs, colors, title),
        "throughput_latency.png": _throughput_latency(runs, colors, title),
        "timeline.png": _timeline(runs, colors, title),
    }
    paths = []
    for name, fig in figures.items():
        path = out_dir / name
        fig.savefig(path, dpi=DPI)
        paths.append(path)
    return paths


def _heading(what: str, title: str) -> str:
    return f"{what}\n{title}" if title else what


def _positive(values: np.ndarray) -> np.ndarray:
    """Finite values > 0: the ones a log axis can show."""
    values = np.asarray(values, dtype=float)
    if values.size and np.isfinite(values).all() and values.min() > 0:
        return values  # the common case: no copy of millions of ITLs
    return values[np.isfinite(values) & (values > 0)]


def _cdf_points(values_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Empirical CDF at CDF_BINS + 1 log-spaced edges: x in ms, y in [0, 1]; O(n)."""
    logs = np.log10(values_ms.astype(np.float32))  # float32: twice as fast, ample for bins
    low, high = float(logs.min()), float(logs.max())
    bins_per_decade = CDF_BINS / max(high - low, 1e-6)
    index = np.minimum(((logs - low) * bins_per_decade).astype(np.int32), CDF_BINS - 1)
    counts = np.bincount(index, minlength=CDF_BINS)
    edges = low + np.arange(CDF_BINS + 1) / bins_per_decade
    return 10.0**edges, np.concatenate(([0.0], np.cumsum(counts) / values_ms.size))


def _log_scale(ax: Axes, which: str) -> None:
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


def _cdf_axes(fig: Figure, what: str, xlabel: str, title: str) -> Axes:
    ax = fig.add_subplot()
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of values \u2264 x")
    ax.set_title(_heading(what, title))
    ax.grid(True, which="both", alpha=0.3)
    return ax


def _ttft_cdf(runs: dict[str, RunTables], colors: dict[str, str], title: str) -> Figure:
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = _cdf_axes(fig, "TTFT CDF per policy (completed requests)", "TTFT (ms, log)", title)
    drawn = False
    for name, run in runs.items():
        done = run.requests[run.requests["finish_reason"].isin(_DONE)]
        ttft_ms = _positive(done["ttft_ms"].to_numpy())
        if ttft_ms.size == 0:
            ax.plot([], [], color=colors[name], label=f"{name} (no completed requests)")
            continue
        x, y = _cdf_points(ttft_ms)
        ax.plot(x, y, color=colors[name], label=f"{name} (n={ttft_ms.size})")
        drawn = True
    if drawn:
        _log_scale(ax, "x")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never hides a curve
    return fig


def _itl_cdf(runs: dict[str, RunTables], colors: dict[str, str], title: str) -> Figure:
    fig = Figure(figsize=(8, 5), layout="constrained")
    ax = _cdf_axes(fig, "ITL CDF per policy, p99 marked", "inter-token latency (ms, log)", title)
    drawn = False
    for name, run in runs.items():
        itl_ms = _positive(run.itl_ms)
        if itl_ms.size == 0:
            ax.plot([], [], color=colors[name], label=f"{name} (no token gaps)")
            continue
        x, y = _cdf_points(itl_ms)
        p99_ms = run.summary.get("p99_itl_ms")  # the summary's number, as in the bars
        if p99_ms is None:
            p99_ms = float(np.percentile(itl_ms, 99))
        ax.plot(x, y, color=colors[name], label=f"{name} (p99 {p99_ms:.3g} ms)")
        ax.axvline(p99_ms, color=colors[name], linestyle="--", linewidth=1, alpha=0.8)
        ax.plot([p99_ms], [0.99], "o", color=colors[name])
        drawn = True
    if drawn:
        ax.axhline(0.99, color="black", linestyle=":", linewidth=0.8)
        _log_scale(ax, "x")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never hides a curve
    return fig


def _summary_value(summary: dict, key: str) -> float:
    """A summary number, NaN when absent, None or not > 0 (bars on a log axis)."""
    value = summary.get(key)
    return float(value) if value is not None and value > 0 else np.nan


def _ms_label(value_ms: float) -> str:
    """A bar label: whole ms from 10 ms up, else two significant digits."""
    return f"{value_ms:.0f}" if value_ms >= 10 else f"{value_ms:.2g}"


def _throughput_latency(runs: dict[str, RunTables], colors: dict[str, str], title: str) -> Figure:
    fig = Figure(figsize=(12, 5), layout="constrained")
    tput_ax, lat_ax = fig.subplots(1, 2, width_ratios=(1, 2.2))
    names = list(runs)
    tput = [_summary_value(runs[n].summary, "output_throughput") for n in names]
    bars = tput_ax.bar(names, np.nan_to_num(tput), color=[colors[n] for n in names])
    tput_ax.bar_label(bars, fmt="%.0f", fontsize=8)
    tput_ax.set_ylabel("output throughput (tokens/s)")
    tput_ax.set_title("Output throughput")
    tput_ax.tick_params(axis="x", labelrotation=20)
    tput_ax.margins(y=0.12)
    tput_ax.set_ylim(bottom=0)

    width = 0.8 / len(names)
    groups = np.arange(len(_LATENCY_BARS))
    for i, name in enumerate(names):
        heights = [_summary_value(runs[name].summary, key) for key, _ in _LATENCY_BARS]
        bars = lat_ax.bar(
            groups + (i - (len(names) - 1) / 2) * width,
            heights,
            width,
            color=colors[name],
            label=name,
        )
        lat_ax.bar_label(bars, fmt=_ms_label, fontsize=7, rotation=90, padding=2)
    lat_ax.set_xticks(groups, [label for _, label in _LATENCY_BARS])
    if any(np.isfinite(bar.get_height()) for bar in lat_ax.patches):
        _log_scale(lat_ax, "y")
    lat_ax.margins(y=0.25)
    lat_ax.set_ylabel("latency (ms, log)")
    lat_ax.set_title("Latency percentiles (completed requests)")
    lat_ax.grid(True, axis="y", which="both", alpha=0.3)
    lat_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.suptitle(_heading("Throughput and latency per policy", title))
    return fig


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


_TIMELINE_PANELS = (  # (column, reducer, y label)
    ("batch_size", "mean", "batch size (rows, mean)"),
    ("num_waiting", "mean", "waiting queue (requests, mean)"),
    ("kv_pct", "mean", "KV usage (% of blocks, mean)"),
    ("step_ms", "max", "step time (ms, max)"),
)


def _timeline_columns(run: RunTables) -> dict[str, np.ndarray]:
    steps = run.steps
    return {
        "batch_size": steps["batch_size"].to_numpy(dtype=float),
        "num_waiting": steps["num_waiting"].to_numpy(dtype=float),
        "kv_pct": steps["kv_blocks_used"].to_numpy(dtype=float) * 100.0 / run.num_blocks,
        "step_ms": steps["duration_s"].to_numpy(dtype=float) * 1e3,
    }


def _time_edges_s(runs: dict[str, RunTables]) -> np.ndarray:
    """TIMELINE_BINS + 1 bin edges (s) from the first step start to the last step end.

    One grid for every policy, so the bins line up across lines.
    """
    busy = [run.steps for run in runs.values() if len(run.steps)]
    t0_s = min(float(steps["start_s"].min()) for steps in busy)
    t1_s = max(float((steps["start_s"] + steps["duration_s"]).max()) for steps in busy)
    return np.linspace(t0_s, max(t1_s, t0_s + 1e-9), TIMELINE_BINS + 1)


def _timeline(runs: dict[str, RunTables], colors: dict[str, str], title: str) -> Figure:
    fig = Figure(figsize=(11, 10), layout="constrained")
    axes = fig.subplots(len(_TIMELINE_PANELS), 1, sharex=True)
    reducers = {column: reducer for column, reducer, _ in _TIMELINE_PANELS}
    edges_s = _time_edges_s(runs) if any(len(run.steps) for run in runs.values()) else None
    max_step_ms = 0.0
    for name, run in runs.items():
        if edges_s is None or not len(run.steps):
            axes[0].plot([], [], color=colors[name], label=f"{name} (no steps)")
            continue
        start_s = run.steps["start_s"].to_numpy(dtype=float)
        centres_s, binned = _binned(start_s, _timeline_columns(run), edges_s, reducers)
        for ax, (column, _, _) in zip(axes, _TIMELINE_PANELS, strict=True):
            label = name if ax is axes[0] else None
            ax.plot(centres_s, binned[column], color=colors[name], linewidth=1, label=label)
        max_step_ms = max(max_step_ms, float(binned["step_ms"].max()))
    for ax, (_, _, ylabel) in zip(axes, _TIMELINE_PANELS, strict=True):
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    axes[2].set_ylim(0, 105)
    if max_step_ms > 0:
        _log_scale(axes[3], "y")  # prefill spikes and decode steps differ by orders
    axes[-1].set_xlabel("time (s)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside upper right", ncols=min(len(runs), 4))
    heading = _heading(f"Scheduler state over time ({TIMELINE_BINS} time bins)", title)
    fig.suptitle(heading, x=0.02, ha="left")
    return fig
