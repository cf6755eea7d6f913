"""Latency vs load from a sweep table: p99 TTFT, p99 ITL and throughput per configuration,
the SLO targets drawn in, and each configuration's capacity at SLO marked."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from servelab.reporting.charts.basic import DPI
from servelab.sweeps.grid import CapacitySlo

_KEY = ["policy", "num_blocks", "token_budget", "max_num_seqs"]
_POLICY_ORDER = {"static": 0, "continuous": 1, "recompute": 2, "chunked": 3}


def config_label(row: dict, varying: list[str]) -> str:
    """The policy plus whichever limits the sweep varied."""
    names = {"num_blocks": "blocks", "token_budget": "budget", "max_num_seqs": "seqs"}
    extra = [f"{names[k]} {row[k]}" for k in varying]
    return row["policy"] + (f" ({', '.join(extra)})" if extra else "")


def capacity_title(capacity: list[dict], varying: list[str]) -> str:
    """'capacity at SLO (req/s): chunked 22.9 > continuous 20.8 > ...', best first."""
    if not capacity:
        return ""
    ranked = sorted(capacity, key=lambda r: -r["capacity_rate_rps"])
    parts = " > ".join(f"{config_label(r, varying)} {r['capacity_rate_rps']:.1f}"
                       for r in ranked)
    return f"capacity at SLO (req/s): {parts}"


def latency_vs_load(table: pd.DataFrame, capacity: list[dict], slo: CapacitySlo,
                    out_dir: Path, title: str) -> Path:
    """Three panels against the request rate; returns the PNG's path."""
    # The limits the sweep varied within a policy (budgets differ between policies anyway).
    varying = [k for k in _KEY[1:] if (table.groupby("policy")[k].nunique() > 1).any()]
    fig = Figure(figsize=(16, 5.2), layout="constrained")
    ax_ttft, ax_itl, ax_tput = fig.subplots(1, 3)
    groups = sorted(table.groupby(_KEY, sort=False),
                    key=lambda g: (_POLICY_ORDER.get(g[0][0], 9), g[0][1:]))
    for i, (key, rows) in enumerate(groups):
        rows = rows.sort_values("rate_rps")
        label = config_label(dict(zip(_KEY, key, strict=True)), varying)
        color = f"C{i % 10}"
        # Distinct markers and dashes keep configurations that coincide (continuous and
        # recompute while KV is plentiful) both visible.
        style = {"color": color, "marker": "osD^v<>"[i % 7], "linestyle": ("-", "--")[i % 2],
                 "markersize": 7 - (i % 3), "label": label}
        x = rows["rate_rps"]
        ax_ttft.plot(x, rows["p99_ttft_ms"] / 1e3, **style)
        ax_itl.plot(x, rows["p99_itl_ms"], **style)
        ax_tput.plot(x, rows["output_throughput"], **style)
        for record in capacity:
            if tuple(record[k] for k in _KEY) == tuple(key) and record["capacity_rate_rps"]:
                for ax in (ax_ttft, ax_itl, ax_tput):
                    ax.axvline(record["capacity_rate_rps"], color=color, linestyle=":",
                               linewidth=1.5)
    ax_ttft.axhline(slo.ttft_p99_ms / 1e3, color="black", linestyle="--", linewidth=1,
                    label=f"SLO {slo.ttft_p99_ms / 1e3:g} s")
    ax_itl.axhline(slo.itl_p99_ms, color="black", linestyle="--", linewidth=1,
                   label=f"SLO {slo.itl_p99_ms:g} ms")
    ax_ttft.set_yscale("log")
    ax_ttft.set_ylabel("p99 TTFT (s, log)")
    ax_itl.set_ylabel("p99 inter-token latency (ms)")
    ax_tput.set_ylabel("output throughput (tokens/s)")
    for ax, name in ((ax_ttft, "p99 TTFT"), (ax_itl, "p99 ITL"), (ax_tput, "throughput")):
        ax.set_xlabel("arrival rate (requests/s)")
        ax.set_title(f"{name} vs load")
        ax.grid(alpha=0.3)
    ax_ttft.legend(fontsize=8, loc="lower right")
    ax_itl.legend(fontsize=8, loc="lower right")
    headline = capacity_title(capacity, varying) or "latency vs load per policy"
    fig.suptitle(f"{headline}\n{title}; dotted lines: capacity at SLO")
    path = Path(out_dir) / "latency_vs_load.png"
    fig.savefig(path, dpi=DPI)
    return path
