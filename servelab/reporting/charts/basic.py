"""Charts of a run per policy (`--out DIR`): TTFT and ITL CDFs,
throughput and latency bars, and a timeline (servelab/reporting/charts/timeline_chart.py).
Each title says the finding first, then what is drawn and the run (`title`: trace, rate,
model and GPU). Reads finished result tables only; draws on `matplotlib.figure.Figure`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from servelab.reporting.charts.series import (
    SeriesStyle,
    extremes,
    heading,
    identical_to,
    log_scale,
    ms_text,
    series_styles,
    with_twin,
)
from servelab.reporting.charts.timeline_chart import timeline_chart
from sim.policy_runs import RunTables

CDF_BINS = 2000  # log-spaced bins per CDF curve: O(n) for millions of ITLs
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
    styles = series_styles(list(runs))  # colour, dashes and marker per policy
    figures = {
        "ttft_cdf.png": _ttft_cdf(runs, styles, title),
        "itl_cdf.png": _itl_cdf(runs, styles, title),
        "throughput_latency.png": _throughput_latency(runs, styles, title),
        "timeline.png": timeline_chart(runs, styles, title),
    }
    paths = []
    for name, fig in figures.items():
        path = out_dir / name
        fig.savefig(path, dpi=DPI)
        paths.append(path)
    return paths


def _summaries(runs: dict[str, RunTables], key: str) -> dict[str, float | None]:
    return {name: run.summary.get(key) for name, run in runs.items()}


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


def _cdf_axes(fig: Figure, heading_text: str, xlabel: str) -> Axes:
    ax = fig.add_subplot()
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("fraction of values \u2264 x")
    fig.suptitle(heading_text, fontsize=10)  # over the legend too: never clipped
    ax.grid(True, which="both", alpha=0.3)
    return ax


def _ttft_cdf(runs: dict[str, RunTables], styles: dict[str, SeriesStyle], title: str) -> Figure:
    fig = Figure(figsize=(9, 5), layout="constrained")
    finding = extremes(_summaries(runs, "median_ttft_ms"), "median TTFT", ms_text, True)
    ax = _cdf_axes(fig, heading(finding, "TTFT CDF per policy (completed requests)", title),
                   "TTFT (ms, log)")
    values = {}
    for name, run in runs.items():
        done = run.requests[run.requests["finish_reason"].isin(_DONE)]
        values[name] = np.sort(_positive(done["ttft_ms"].to_numpy()))
    twins = identical_to(values)
    drawn = False
    for name, ttft_ms in values.items():
        style = styles[name]
        if ttft_ms.size == 0:
            ax.plot([], [], color=style.color, label=f"{name} (no completed requests)")
            continue
        x, y = _cdf_points(ttft_ms)
        ax.plot(x, y, label=with_twin(f"{name} (n={ttft_ms.size})", name, twins),
                **style.line(x.size))
        drawn = True
    if drawn:
        log_scale(ax, "x")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never hides a curve
    return fig


def _itl_cdf(runs: dict[str, RunTables], styles: dict[str, SeriesStyle], title: str) -> Figure:
    fig = Figure(figsize=(9, 5), layout="constrained")
    finding = extremes(_summaries(runs, "p99_itl_ms"), "p99 ITL", ms_text, True)
    ax = _cdf_axes(fig, heading(finding, "ITL CDF per policy, p99 marked", title),
                   "inter-token latency (ms, log)")
    twins = identical_to({name: run.itl_ms for name, run in runs.items()})
    drawn = False
    for name, run in runs.items():
        style = styles[name]
        itl_ms = _positive(run.itl_ms)
        if itl_ms.size == 0:
            ax.plot([], [], color=style.color, label=f"{name} (no token gaps)")
            continue
        x, y = _cdf_points(itl_ms)
        p99_ms = run.summary.get("p99_itl_ms")  # the summary's number, as in the bars
        if p99_ms is None:
            p99_ms = float(np.percentile(itl_ms, 99))
        ax.plot(x, y, label=with_twin(f"{name} (p99 {p99_ms:.3g} ms)", name, twins),
                **style.line(x.size))
        ax.axvline(p99_ms, color=style.color, linestyle=style.linestyle, linewidth=1,
                   alpha=0.6)
        ax.plot([p99_ms], [0.99], style.marker, color=style.color)
        drawn = True
    if drawn:
        ax.axhline(0.99, color="black", linestyle=":", linewidth=0.8)
        log_scale(ax, "x")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: never hides a curve
    return fig


def _summary_value(summary: dict, key: str) -> float:
    """A summary number, NaN when absent, None or not > 0 (bars on a log axis)."""
    value = summary.get(key)
    return float(value) if value is not None and value > 0 else np.nan


def _ms_label(value_ms: float) -> str:
    """A bar label: whole ms from 10 ms up, else two significant digits."""
    return f"{value_ms:.0f}" if value_ms >= 10 else f"{value_ms:.2g}"


def _throughput_latency(runs: dict[str, RunTables], styles: dict[str, SeriesStyle],
                        title: str) -> Figure:
    fig = Figure(figsize=(12, 5.5), layout="constrained")
    tput_ax, lat_ax = fig.subplots(1, 2, width_ratios=(1, 2.2))
    names = list(runs)
    tput = [_summary_value(runs[n].summary, "output_throughput") for n in names]
    bars = tput_ax.bar(names, np.nan_to_num(tput), color=[styles[n].color for n in names])
    tput_ax.bar_label(bars, fmt="%.0f", fontsize=8)
    tput_ax.set_ylabel("output throughput (tokens/s)")
    tput_ax.set_title("Output throughput")
    tput_ax.tick_params(axis="x", labelrotation=20)
    tput_ax.margins(y=0.12)
    tput_ax.set_ylim(bottom=0)

    width = 0.8 / len(names)
    groups = np.arange(len(_LATENCY_BARS))
    heights = {name: np.array([_summary_value(runs[name].summary, key)
                               for key, _ in _LATENCY_BARS]) for name in names}
    twins = identical_to(heights)
    for i, name in enumerate(names):
        bars = lat_ax.bar(groups + (i - (len(names) - 1) / 2) * width, heights[name], width,
                          color=styles[name].color, label=with_twin(name, name, twins),
                          hatch="//" if name in twins else None, edgecolor="white")
        lat_ax.bar_label(bars, fmt=_ms_label, fontsize=7, rotation=90, padding=2)
    lat_ax.set_xticks(groups, [label for _, label in _LATENCY_BARS])
    if any(np.isfinite(bar.get_height()) for bar in lat_ax.patches):
        log_scale(lat_ax, "y")
    lat_ax.margins(y=0.25)
    lat_ax.set_ylabel("latency (ms, log)")
    lat_ax.set_title("Latency percentiles (completed requests)")
    lat_ax.grid(True, axis="y", which="both", alpha=0.3)
    lat_ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0))
    finding = extremes(_summaries(runs, "output_throughput"), "output throughput",
                       lambda v: f"{v:,.0f} tok/s", low_is_best=False)
    fig.suptitle(heading(finding, "Throughput and latency per policy", title), fontsize=11)
    return fig
