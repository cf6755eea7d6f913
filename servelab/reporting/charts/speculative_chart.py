"""The speculative-decoding crossover: mean TPOT and output throughput against the request
rate, with and without speculation, and where speculation stops paying."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from servelab.reporting.charts.basic import DPI

CHART_NAME = "speculative_crossover.png"


def crossover_chart(paired: Sequence[dict], crossovers: dict[str, dict], out_dir: Path,
                    title: str, notes: Sequence[str]) -> Path:
    """Two panels against the rate, plain solid and speculative dashed per policy, a dotted
    line at each crossover; `notes` (a line each, one per policy's verdict) under the title.
    Returns the PNG's path."""
    fig = Figure(figsize=(13, 5.6), layout="constrained")
    ax_tpot, ax_tput = fig.subplots(1, 2)
    for i, policy in enumerate(crossovers):
        rows = sorted((r for r in paired if r["policy"] == policy),
                      key=lambda r: r["rate_rps"])
        x = [r["rate_rps"] for r in rows]
        color = f"C{i % 10}"
        for ax, key in ((ax_tpot, "mean_tpot_ms"), (ax_tput, "output_throughput")):
            ax.plot(x, [r[f"plain_{key}"] for r in rows], color=color, marker="o",
                    label=f"{policy}, plain")
            ax.plot(x, [r[f"spec_{key}"] for r in rows], color=color, marker="s",
                    linestyle="--", label=f"{policy}, speculative")
        rate = crossovers[policy]["rate_rps"]
        if rate is not None:
            for ax in (ax_tpot, ax_tput):
                ax.axvline(rate, color=color, linestyle=":", linewidth=1.5)
            ax_tpot.annotate(f"stops paying\n~{rate:.1f} req/s", (rate, 0.95),
                             xycoords=("data", "axes fraction"), ha="left", va="top",
                             fontsize=8, color=color, xytext=(4, 0),
                             textcoords="offset points")
    ax_tpot.set_ylabel("mean TPOT (ms)")
    ax_tput.set_ylabel("output throughput (tokens/s)")
    for ax, name in ((ax_tpot, "mean TPOT"), (ax_tput, "output throughput")):
        ax.set_xscale("log")
        ax.set_xlabel("arrival rate (requests/s, log)")
        ax.set_title(f"{name} vs load")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("\n".join([title, *notes]), fontsize=10)
    path = Path(out_dir) / CHART_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI)
    return path
