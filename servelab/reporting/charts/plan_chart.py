"""The capacity planner's chart: every probed deployment's price against its p99 TTFT."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

DPI = 110


def plan_chart(probes: pd.DataFrame, cheapest: pd.DataFrame, slo_ttft_p99_ms: float,
               out_dir: Path, title: str) -> Path:
    """Scatter of $/hour against p99 TTFT per GPU type (hollow: misses the SLO), the
    cheapest deployment per GPU ringed, and the SLO as a line; returns the PNG's path."""
    fig = Figure(figsize=(8, 5), dpi=DPI)
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
               label=f"SLO p99 TTFT {slo_ttft_p99_ms:g} ms")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("deployment price, $ per hour")
    ax.set_ylabel("p99 TTFT, ms")
    ax.set_title(f"{title}: every simulated deployment (hollow: misses the SLO)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(out_dir) / "plan.png"
    fig.savefig(path)
    return path
