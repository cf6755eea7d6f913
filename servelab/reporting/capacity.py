"""Report section 4: latency vs load per policy on the conv trace, and each policy's
capacity at SLO for the default KV pool and for a small one (where KV, not slots, binds)."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from servelab.reporting.charts.sweep_charts import latency_vs_load as draw
from servelab.reporting.sections import DEPLOYMENT, Section, default_deployment
from servelab.sweeps.grid import (
    DEFAULT_QPS_SCALES,
    CapacitySlo,
    SweepContext,
    SweepPoint,
    capacity_records,
    find_capacity,
    grid,
)
from servelab.sweeps.runners import LocalRunner
from sim.engine.scheduler_config import POLICIES
from workloads import Trace, load_bundled

RATES = DEFAULT_QPS_SCALES
SMALL_POOL = 4000  # blocks: 64k tokens, a quarter of what 256 conv requests can hold
SLO = CapacitySlo(ttft_p99_ms=2000.0, itl_p99_ms=200.0)
RANGE = (0.25, 16.0)


def latency_vs_load(out: Path, workers: int | None, trace: Trace | None = None,
                    rates: tuple[float, ...] = RATES) -> Section:
    backend, default_pool = default_deployment()
    trace = trace if trace is not None else load_bundled("azure-conv")
    context = SweepContext(trace, backend, default_pool)
    with LocalRunner(context, workers or os.cpu_count()) as runner:
        rows = runner(grid(POLICIES, rates))
        capacity = {}
        for label, blocks in (("default", None), ("small", SMALL_POOL)):
            configs = [SweepPoint(p, 1.0, num_blocks=blocks) for p in POLICIES]
            capacity[label] = capacity_records(
                find_capacity(runner, configs, SLO, *RANGE), SLO)
    table = pd.DataFrame(rows)
    table.to_csv(out / "sweep.csv", index=False)
    path = draw(table, capacity["default"], SLO, out, f"{trace.name}; {DEPLOYMENT}")
    rate = {label: {r["policy"]: r["capacity_rate_rps"] for r in records}
            for label, records in capacity.items()}
    ranked = sorted(POLICIES, key=lambda p: -rate["default"][p])
    finding = (f"At p99 TTFT <= {SLO.ttft_p99_ms / 1e3:g} s and p99 ITL <= {SLO.itl_p99_ms:g} ms "
               "the default deployment holds " + ", ".join(
                   f"{p} {rate['default'][p]:.1f}" for p in ranked) + " req/s")
    rows_md = ["| policy | capacity, default pool (req/s) | capacity, "
               f"{SMALL_POOL:,}-block pool (req/s) |", "|---|---:|---:|"]
    rows_md += [f"| {p} | {rate['default'][p]:.2f} | {rate['small'][p]:.2f} |" for p in POLICIES]
    body = "\n".join(rows_md) + "\n\n" + explain(rate, default_pool)
    return Section("Latency vs load and capacity at SLO", finding, [path], body,
                   {"capacity_rps": rate, "slo": {"ttft_p99_ms": SLO.ttft_p99_ms,
                                                  "itl_p99_ms": SLO.itl_p99_ms}})


def explain(rate: dict[str, dict[str, float]], default_pool: int) -> str:
    """Why the ordering is what it is (Sarathi-Serve expects chunked > recompute >
    continuous > static)."""
    d, s = rate["default"], rate["small"]
    notes = []
    if d["static"] == 0:
        notes.append("- `static` meets the TTFT target at no rate in the range: a request "
                     "that arrives while a batch runs waits for that batch's longest output, "
                     "seconds even when the engine is nearly idle.")
    if abs(d["continuous"] - d["recompute"]) < 1e-9:
        notes.append(f"- With the default pool ({default_pool:,} blocks) `continuous` and "
                     "`recompute` tie: 256 slots fill before KV does, so reserving each "
                     "request's whole output up front costs nothing and nothing is preempted.")
    if abs(s["recompute"] - s["continuous"]) < 1e-9:
        notes.append(f"- With a {SMALL_POOL:,}-block pool KV binds, yet `recompute` holds no "
                     "more than `continuous` at this SLO: it admits a few more requests, and "
                     "those it evicts pay for the recompute in p99 TTFT.")
    elif s["recompute"] > s["continuous"]:
        notes.append(f"- With a {SMALL_POOL:,}-block pool KV binds: `recompute` allocates KV "
                     f"as tokens arrive and holds {s['recompute']:.1f} req/s against "
                     f"`continuous`'s {s['continuous']:.1f}, which reserves every output's "
                     "full length at admission.")
    if s["chunked"] < s["recompute"]:
        notes.append(f"- In the small pool `chunked` ({s['chunked']:.1f} req/s) falls behind "
                     "`recompute`: it admits a long prompt a chunk at a time while KV is "
                     "short, the prompt's next chunks evict the newest requests (or the "
                     "prompt itself), and evictions cascade (the undersized-pool section "
                     "counts them).")
    if d["chunked"] > d["recompute"]:
        notes.append("- `chunked` leads: prompts are split under a 2,048-token step budget, so "
                     "long prefills no longer stall decodes and p99 ITL stays low as load "
                     "grows; the TTFT target binds later.")
    return "\n".join(notes)
