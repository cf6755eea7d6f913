"""The capacity planner's chart: every probed deployment's price against its p99 TTFT."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from servelab.reporting.charts.series import log_scale

DPI = 110


def plan_chart(probes: pd.DataFrame, cheapest: pd.DataFrame, slo_ttft_p99_ms: float,
               out_dir: Path, title: str) -> Path:
    """plan_figure written to out_dir/plan.png; returns the PNG's path."""
    path = Path(out_dir) / "plan.png"
    plan_figure(probes, cheapest, slo_ttft_p99_ms, title).savefig(path)
    return path


def plan_figure(probes: pd.DataFrame, cheapest: pd.DataFrame, slo_ttft_p99_ms: float,
                title: str) -> Figure:
    """Scatter of $/hour against p99 TTFT per GPU type (hollow: misses the SLO), the
    cheapest deployment per GPU ringed, and the SLO as a line."""
    fig = Figure(figsize=(10, 5.5), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    for i, (hardware, rows) in enumerate(probes.groupby("hardware", sort=True)):
        color = f"C{i % 10}"
        met = rows[rows["meets_slo"]]
        missed = rows[~rows["meets_slo"]]
        ax.scatter(met["usd_per_hour"], met["p99_ttft_ms"], color=color, label=hardware, s=24)
        ax.scatter(missed["usd_per_hour"], missed["p99_ttft_ms"], facecolors="none",
                   edgecolors=color, s=24)
    if len(cheapest):
        ax.scatter(cheapest["usd_per_hour"], cheapest["p99_ttft_ms"], facecolors="none",
                   edgecolors="black", s=140, linewidths=1.5, label="cheapest per GPU")
    ax.axhline(slo_ttft_p99_ms, color="grey", linestyle="--", linewidth=1,
               label=f"SLO: p99 TTFT {slo_ttft_p99_ms:g} ms")
    if len(probes):  # (an empty log axis cannot place ticks)
        log_scale(ax, "x")
        log_scale(ax, "y")
    ax.set_xlabel("deployment price ($ per hour, log)")
    ax.set_ylabel("p99 TTFT (ms, log)")
    ax.grid(True, which="both", alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    handles += [Line2D([], [], marker="o", color="grey", linestyle="none"),
                Line2D([], [], marker="o", markerfacecolor="none", color="grey",
                       linestyle="none")]
    labels += ["filled: meets the SLO", "hollow: misses the SLO"]
    ax.legend(handles, labels, title="GPU type (colour)", fontsize=8,
              loc="upper left", bbox_to_anchor=(1.01, 1.0))  # outside: hides no point
    fig.suptitle(f"{_finding(cheapest)}\nprice against p99 TTFT of every simulated "
                 f"deployment \u00b7 {title}", fontsize=10)
    return fig


def _finding(cheapest: pd.DataFrame) -> str:
    """The cheapest deployment that met the SLO, in a few words."""
    if not len(cheapest):
        return "no deployment met the SLO"
    best = cheapest.loc[cheapest["usd_per_hour"].idxmin()]
    return (f"cheapest meeting the SLO: {best['hardware']} at ${best['usd_per_hour']:.2f}/h "
            f"(p99 TTFT {best['p99_ttft_ms']:.0f} ms)")
