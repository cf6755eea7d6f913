"""Charts of `servelab report` sections 1-3 and 6; each title states the chart's finding.

Reads finished runs and summaries only (no torch): measured and simulated static vs
continuous, the inter-token gaps around a long prompt, an undersized KV pool, and prefix
caching against pool size.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from servelab.reporting.charts.basic import DPI
from sim.engine.step_log import FIELDS, step_array
from sim.replay.simulation import RunResult

# (summary key, panel title, unit, scale) of the static-vs-continuous panels.
_BATCHING_PANELS = (
    ("output_throughput", "output throughput", "tokens/s", 1.0),
    ("median_ttft_ms", "TTFT p50", "ms", 1.0),
    ("p95_ttft_ms", "TTFT p95", "ms", 1.0),
    ("slot_utilization", "slot utilization", "% of batch rows doing work", 100.0),
)

# (summary key, panel title, unit, scale) of the caching on/off panels.
_CACHING_PANELS = (
    ("median_ttft_ms", "TTFT p50", "s", 1e-3),
    ("p99_ttft_ms", "TTFT p99", "s", 1e-3),
    ("output_throughput", "output throughput", "tokens/s", 1.0),
)


def batching_bars(results: dict[str, dict[str, dict]], finding: str, subtitle: str,
                  path: Path) -> Path:
    """results[policy]["measured"|"simulated"] = summary; one panel per metric."""
    fig = Figure(figsize=(15, 4.6), layout="constrained")
    axes = fig.subplots(1, len(_BATCHING_PANELS))
    policies = list(results)
    x = np.arange(len(policies))
    for ax, (key, name, unit, scale) in zip(axes, _BATCHING_PANELS, strict=True):
        for offset, (source, hatch) in zip((-0.2, 0.2), (("measured", ""), ("simulated", "//")),
                                           strict=True):
            values = [scale * (results[p][source].get(key) or 0.0) for p in policies]
            bars = ax.bar(x + offset, values, 0.4, color=[f"C{i}" for i in range(len(x))],
                          hatch=hatch, edgecolor="black", linewidth=0.5, label=source)
            ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_xticks(x, policies)
        ax.set_ylabel(unit)
        ax.set_title(name)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"{finding}\n{subtitle}")
    fig.savefig(path, dpi=DPI)
    return path


def token_gaps(runs: dict[str, RunResult], watch: list[str], long_id: str, finding: str,
               subtitle: str, path: Path) -> Path:
    """Per policy: each watched request's gap to its previous token against time, and the
    long request's arrival and first token marked."""
    fig = Figure(figsize=(14, 4.6), layout="constrained")
    axes = fig.subplots(1, len(runs), sharey=True, squeeze=False)[0]
    for ax, (policy, run) in zip(axes, runs.items(), strict=True):
        by_id = {r.request_id: r for r in run.requests}
        for i, rid in enumerate(watch):
            times = np.asarray(by_id[rid].token_times_s)
            ax.plot(times[1:], 1e3 * np.diff(times), ".-", color=f"C{i % 10}", linewidth=0.8,
                    markersize=3, label=rid if i < 4 else None)
        long_request = by_id[long_id]
        ax.axvline(long_request.arrival_s, color="black", linestyle="--", linewidth=1,
                   label=f"{long_request.prompt_len:,}-token prompt arrives")
        if long_request.token_times_s:
            ax.axvline(long_request.token_times_s[0], color="red", linestyle=":", linewidth=1,
                       label="its first token")
        ax.set_xlabel("time (s)")
        ax.set_title(policy)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    axes[0].set_ylabel("gap since the request's previous token (ms)")
    fig.suptitle(f"{finding}\n{subtitle}")
    fig.savefig(path, dpi=DPI)
    return path


def _steps(run: RunResult) -> dict[str, np.ndarray]:
    table = step_array(run.steps)
    return {name: table[:, i] for i, name in enumerate(FIELDS)}


def starvation(runs: dict[str, dict[str, RunResult]], summaries: dict[str, dict[str, dict]],
               finding: str, subtitle: str, path: Path) -> Path:
    """runs[policy][pool label]: queue length and cumulative preemptions over time, and the
    p99 TTFT / E2EL each pool gives."""
    fig = Figure(figsize=(16, 4.8), layout="constrained")
    ax_queue, ax_pre, ax_lat = fig.subplots(1, 3)
    for i, (policy, pools) in enumerate(runs.items()):
        for pool, run in pools.items():
            steps = _steps(run)
            style = "-" if pool == "undersized" else ":"
            end_s = steps["start_s"] + steps["duration_s"]
            ax_queue.plot(end_s, steps["num_waiting"], style, color=f"C{i}",
                          label=f"{policy}, {pool}")
            ax_pre.plot(end_s, np.cumsum(steps["num_preempted"]), style, color=f"C{i}",
                        label=f"{policy}, {pool}")
    ax_queue.set_ylabel("requests waiting")
    ax_queue.set_title("queue over time")
    ax_pre.set_ylabel("preemptions so far")
    ax_pre.set_title("preemptions over time")
    for ax in (ax_queue, ax_pre):
        ax.set_xlabel("time (s)")
        ax.grid(alpha=0.3)
    ax_queue.legend(fontsize=8)
    keys = (("p99_ttft_ms", "TTFT p99"), ("p99_e2el_ms", "E2EL p99"))
    labels, offsets = [], np.arange(len(keys))
    width = 0.8 / (2 * len(summaries))
    for i, (policy, pools) in enumerate(summaries.items()):
        for j, (pool, summary) in enumerate(pools.items()):
            position = offsets + (2 * i + j - (2 * len(summaries) - 1) / 2) * width
            ax_lat.bar(position, [summary[k] / 1e3 for k, _ in keys], width, color=f"C{i}",
                       hatch="" if pool == "undersized" else "//", edgecolor="black",
                       linewidth=0.5, label=f"{policy}, {pool}")
            labels.append(pool)
    ax_lat.set_xticks(offsets, [name for _, name in keys])
    ax_lat.set_yscale("log")
    ax_lat.set_ylabel("seconds (log)")
    ax_lat.set_title("what the small pool costs")
    ax_lat.grid(axis="y", alpha=0.3)
    ax_lat.legend(fontsize=8)
    fig.suptitle(f"{finding}\n{subtitle}")
    fig.savefig(path, dpi=DPI)
    return path


def prefix_caching(pools: list[int], hit_rate: list[float], ceiling: float, default_pool: int,
                   runs: dict[str, dict], finding: str, subtitle: str, path: Path) -> Path:
    """Hit rate against KV pool size with the ceiling and the default pool marked; TTFT and
    output throughput of each run in `runs` (label -> summary), caching on solid, off hatched."""
    fig = Figure(figsize=(18, 4.8), layout="constrained")
    ax_hit, *bar_axes = fig.subplots(1, 4, width_ratios=(1.4, 1, 1, 1))
    ax_hit.plot(pools, [100 * h for h in hit_rate], "o-", color="C0", label="simulated")
    ax_hit.axhline(100 * ceiling, color="black", linestyle="--", linewidth=1,
                   label=f"ceiling (unbounded cache) {ceiling:.1%}")
    ax_hit.axvline(default_pool, color="C3", linestyle=":", linewidth=1.5,
                   label=f"default pool, {default_pool:,} blocks")
    ax_hit.set_xscale("log")
    ax_hit.set_ylim(0, 100 * max(ceiling, *hit_rate) * 1.15 + 1)
    ax_hit.set_xlabel("KV pool (blocks, log)")
    ax_hit.set_ylabel("prompt tokens served from the cache (%)")
    ax_hit.set_title("prefix cache hit rate")
    ax_hit.grid(alpha=0.3)
    ax_hit.legend(fontsize=8, loc="lower right")
    labels = list(runs)
    x = np.arange(len(labels))
    style = {"color": [f"C{i // 2}" for i in range(len(labels))], "edgecolor": "black",
             "linewidth": 0.5, "hatch": ["" if k.endswith("on") else "//" for k in labels]}
    for ax, (key, name, unit, scale) in zip(bar_axes, _CACHING_PANELS, strict=True):
        bars = ax.bar(x, [scale * runs[k][key] for k in labels], 0.6, **style)
        ax.bar_label(bars, fmt="%.0f", fontsize=8)
        ax.set_xticks(x, [k.replace(" blocks, caching ", "\n") for k in labels], fontsize=8)
        ax.set_xlabel("KV pool (blocks), caching")
        ax.set_ylabel(unit)
        ax.set_title(name)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{finding}\n{subtitle}")
    fig.savefig(path, dpi=DPI)
    return path
