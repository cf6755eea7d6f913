"""Per-engine tables of a cluster run: each replica's load, cache and latencies, and where
each request was served."""

from __future__ import annotations

import numpy as np
import pandas as pd

from sim.cluster.run import ClusterResult
from sim.replay.metrics import request_table, step_summary
from sim.replay.simulation import RunResult


def replica_table(cluster: ClusterResult) -> pd.DataFrame:
    """One row per engine of a cluster run: its role, load, cache and latencies."""
    end_s = max((r.finish_s for r in cluster.requests if r.finish_s is not None), default=0.0)
    span_s = max(end_s - min((r.arrival_s for r in cluster.requests), default=0.0), 1e-12)
    rows = []
    for index, (role, engine, served) in enumerate(
            zip(cluster.roles, cluster.engines, cluster.served, strict=True)):
        scheduler = engine.scheduler
        steps = RunResult(served, engine.steps, scheduler.num_preemptions,
                          scheduler.config.num_blocks, scheduler.config.max_num_seqs)
        step_stats = step_summary(steps)
        ttft = request_table(served)["ttft_ms"].to_numpy(dtype=float) if served else np.empty(0)
        ttft = ttft[~np.isnan(ttft)]
        queries = scheduler.prefix_cache_queries
        rows.append({
            "replica": index, "role": role, "requests": len(served),
            "busy_frac": sum(engine.steps.column("duration_s")) / span_s,
            "num_steps": step_stats["num_steps"],
            "mean_batch_size": step_stats["mean_batch_size"],
            "mean_kv_usage": step_stats["mean_kv_usage"],
            "preemptions": scheduler.num_preemptions,
            "prefix_cache_hit_rate": scheduler.prefix_cache_hits / queries if queries else 0.0,
            "median_ttft_ms": float(np.median(ttft)) if ttft.size else np.nan,
            "p99_ttft_ms": float(np.percentile(ttft, 99)) if ttft.size else np.nan,
        })
    return pd.DataFrame(rows)


def served_by(cluster: ClusterResult) -> list[int]:
    """The engine index each request ended on (P/D: its decode engine), in request order;
    -1 for a request no engine kept (rejected before routing completed)."""
    where = {id(r): index for index, served in enumerate(cluster.served) for r in served}
    return [where.get(id(r), -1) for r in cluster.requests]
