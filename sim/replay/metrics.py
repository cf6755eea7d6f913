"""Metrics: per-request and per-step tables and the summary.

TTFT = first token - arrival (queue wait included); ITL = gaps between consecutive tokens
of one request; TPOT = (finish - first token) / (output tokens - 1); E2EL = finish - arrival.
Summary keys follow `vllm bench serve`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.engine.core import FinishReason, Request
from sim.engine.queues import FAIR_INPUT_WEIGHT, FAIR_OUTPUT_WEIGHT
from sim.engine.step_log import FIELDS, StepLog, step_array
from sim.replay.simulation import RunResult

PERCENTILES = (("mean", None), ("median", 50), ("p90", 90), ("p95", 95), ("p99", 99))
LATENCIES = ("ttft", "tpot", "itl", "e2el")
_DONE = (FinishReason.LENGTH, FinishReason.STOP)


@dataclass(frozen=True)
class Slo:
    """Service-level objectives for goodput; None means no bound on that metric."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def __post_init__(self) -> None:
        for key in ("ttft_ms", "tpot_ms"):
            value = getattr(self, key)
            if value is not None and not value > 0:
                raise ValueError(f"SLO {key} must be > 0, got {value}")


def request_table(requests: list[Request]) -> pd.DataFrame:
    """One row per request, latencies in milliseconds (NaN where undefined)."""
    rows = []
    for r in requests:
        times = r.token_times_s
        first = times[0] if times else np.nan
        finish = r.finish_s if r.finish_s is not None else np.nan
        n = len(times)
        rows.append((
            r.request_id, r.arrival_s, r.prompt_len, r.max_new_tokens, n,
            r.first_scheduled_s if r.first_scheduled_s is not None else np.nan,
            first, finish, r.num_preemptions, r.num_cached_tokens,
            r.finish_reason.value if r.finish_reason is not None else "unfinished",
            r.finish_detail, r.tenant, r.priority,
        ))
    table = pd.DataFrame(rows, columns=[
        "request_id", "arrival_s", "prompt_len", "max_new_tokens", "output_len",
        "first_scheduled_s", "first_token_s", "finish_s", "num_preemptions",
        "num_cached_tokens", "finish_reason",
        "finish_detail", "tenant", "priority",
    ])
    table["ttft_ms"] = (table["first_token_s"] - table["arrival_s"]) * 1e3
    table["e2el_ms"] = (table["finish_s"] - table["arrival_s"]) * 1e3
    decode_tokens = (table["output_len"] - 1).where(table["output_len"] > 1)
    table["tpot_ms"] = (table["finish_s"] - table["first_token_s"]) * 1e3 / decode_tokens
    return table


def step_table(steps: StepLog | list[tuple]) -> pd.DataFrame:
    """One row per engine step (the fields of StepRecord: two times, then integer counts)."""
    table = pd.DataFrame(step_array(steps), columns=list(FIELDS))
    return table.astype({name: np.int64 for name in FIELDS[2:]})


def inter_token_latencies_ms(requests: list[Request]) -> np.ndarray:
    """All gaps between consecutive tokens of each completed request, in ms."""
    times = [r.token_times_s for r in requests
             if r.finish_reason in _DONE and len(r.token_times_s) > 1]
    if not times:
        return np.empty(0)
    # One flat array and one diff instead of a diff per request: drop the gaps that span
    # two requests (one at each request's first token).
    lengths = np.fromiter(map(len, times), dtype=np.int64, count=len(times))
    flat = np.fromiter(itertools.chain.from_iterable(times), dtype=float,
                       count=int(lengths.sum()))
    keep = np.ones(flat.size - 1, dtype=bool)
    keep[np.cumsum(lengths)[:-1] - 1] = False
    gaps = np.diff(flat)
    del flat  # (a million requests' gaps take gigabytes: each array goes once the next is made)
    gaps = gaps[keep]
    gaps *= 1e3
    return gaps


def prefix_cache_hit_rate(table: pd.DataFrame) -> float:
    """Prompt tokens found in the prefix cache at first admission, over the prompt tokens of
    every admitted request (0 when none was admitted)."""
    admitted = table[table["first_scheduled_s"].notna()]
    prompt = int(admitted["prompt_len"].sum())
    return int(admitted["num_cached_tokens"].sum()) / prompt if prompt else 0.0


def _stats(name: str, values: np.ndarray, out: dict) -> None:
    values = values[~np.isnan(values)]
    if values.size == 0:
        out.update((f"{label}_{name}_ms", None) for label, _ in PERCENTILES)
        return
    # Every percentile from one partition (the same order statistics, the same values as
    # one call each: a run's millions of token gaps are partitioned once, not four times).
    # values is this function's own copy: the mean first, then partitioned in place.
    mean = float(values.mean())
    qs = [q for _, q in PERCENTILES if q is not None]
    at = dict(zip(qs, np.percentile(values, qs, overwrite_input=True).tolist(), strict=True))
    for label, q in PERCENTILES:
        out[f"{label}_{name}_ms"] = mean if q is None else at[q]


def summarize(result: RunResult, slo: Slo | None = None) -> dict:
    """The summary dict: vllm-bench keys plus scheduler health."""
    table = request_table(result.requests)
    done = table[table["finish_reason"].isin([f.value for f in _DONE])]
    rejected = int((table["finish_reason"] == FinishReason.REJECTED.value).sum())
    start = float(table["arrival_s"].min()) if len(table) else 0.0
    end = float(np.nanmax(table["finish_s"])) if done.size else start
    duration_s = max(end - start, 1e-12)
    total_output = int(done["output_len"].sum())
    total_input = int(done["prompt_len"].sum())
    out: dict = {
        "completed": len(done),
        "failed": len(table) - len(done) - rejected,
        "rejected": rejected,
        "duration_s": duration_s,
        "total_input": total_input,
        "total_output": total_output,
        "request_throughput": len(done) / duration_s,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": (total_input + total_output) / duration_s,
        "prefix_cache_hit_rate": prefix_cache_hit_rate(table),
    }
    _stats("ttft", done["ttft_ms"].to_numpy(dtype=float), out)
    _stats("tpot", done["tpot_ms"].to_numpy(dtype=float), out)
    _stats("itl", inter_token_latencies_ms(result.requests), out)
    _stats("e2el", done["e2el_ms"].to_numpy(dtype=float), out)
    out.update(step_summary(result))
    out.update(class_summaries(result.requests, table))
    if slo is not None:
        good = np.ones(len(done), dtype=bool)
        if slo.ttft_ms is not None:
            good &= done["ttft_ms"].to_numpy() <= slo.ttft_ms
        if slo.tpot_ms is not None:
            good &= ~(done["tpot_ms"].to_numpy() > slo.tpot_ms)  # 1-token outputs pass
        out["goodput"] = float(good.sum()) / duration_s
    return out


def step_summary(result: RunResult) -> dict:
    """The step-level keys of a summary: preemptions, steps, batch sizes, KV and slot use."""
    if not result.steps:
        return {"preemptions": result.num_preemptions, "num_steps": 0, "mean_batch_size": 0.0,
                "max_batch_size": 0, "mean_kv_usage": 0.0, "slot_utilization": 0.0}
    steps = step_array(result.steps)
    col = {name: i for i, name in enumerate(FIELDS)}
    duration = steps[:, col["duration_s"]]
    batch = steps[:, col["batch_size"]]
    busy_s = duration.sum()
    kv = steps[:, col["kv_blocks_used"]] / result.num_blocks
    useful_rows = batch - steps[:, col["padding_rows"]]
    return {
        "preemptions": result.num_preemptions,
        "num_steps": len(steps),
        "mean_batch_size": float(batch.mean()),
        "max_batch_size": int(batch.max()),
        # Time-weighted over busy steps.
        "mean_kv_usage": float((kv * duration).sum() / busy_s) if busy_s > 0 else 0.0,
        # Share of computed rows that produced a token or prompt work (static pads the rest).
        "slot_utilization": float(useful_rows.sum() / batch.sum()),
    }


# ---- per tenant and per priority class ---------------------------------------------------
# Service is counted as `--queue fair` counts it (prompt tokens weighted 1, output tokens 2)
# and only up to the last arrival: while requests still arrive the tenants compete (after
# it every queue eventually serves everything). Jain's index is taken over each tenant's
# service relative to its max-min fair share of what was served: 1 when a light tenant
# gets all it asked and the heavy ones split the rest evenly.


def class_summaries(requests: list[Request], table: pd.DataFrame) -> dict:
    """`tenants` and `priorities` tables (only when a run has more than one of either) and
    `jain_fairness_index` over tenants; {} for a run of one tenant and one class."""
    out: dict = {}
    tenants = [r.tenant for r in requests]
    if len(set(tenants)) > 1:
        out["tenants"] = rows = _by(requests, table, tenants)
        served = [row["served_tokens"] for row in rows.values()]
        fair = max_min_shares([row["demand_tokens"] for row in rows.values()], sum(served))
        out["jain_fairness_index"] = jain_index(
            [s / f if f else 1.0 for s, f in zip(served, fair, strict=True)])
    priorities = [r.priority for r in requests]
    if len(set(priorities)) > 1:
        out["priorities"] = {str(k): v for k, v in _by(requests, table, priorities).items()}
    return out


def max_min_shares(demands: list[float], capacity: float) -> list[float]:
    """Max-min fair split of capacity (water-filling): nobody gets more than it asked, and
    what the small asks leave is shared equally by the rest."""
    shares = [0.0] * len(demands)
    left = capacity
    order = sorted(range(len(demands)), key=demands.__getitem__)
    for rank, i in enumerate(order):
        shares[i] = min(demands[i], left / (len(demands) - rank))
        left -= shares[i]
    return shares


def jain_index(values: list[float]) -> float:
    """Jain's index: (sum x)^2 / (n sum x^2); 1 when all are equal, 1/n when one has all."""
    x = np.asarray(values, dtype=float)
    square = float((x * x).sum())
    return float(x.sum() ** 2 / (len(x) * square)) if square > 0 else 1.0


def _by(requests: list[Request], table: pd.DataFrame, keys: list) -> dict:
    end_s = max(r.arrival_s for r in requests)
    groups: dict = {}
    for index, key in enumerate(keys):
        groups.setdefault(key, []).append(index)
    return {key: _group([requests[i] for i in rows], table.iloc[rows], end_s)
            for key, rows in sorted(groups.items())}


def _group(requests: list[Request], table: pd.DataFrame, end_s: float) -> dict:
    done = table[table["finish_reason"].isin([f.value for f in _DONE])]
    ttft = done["ttft_ms"].to_numpy(dtype=float)
    itl = inter_token_latencies_ms(requests)
    served = demand = 0.0
    for r in requests:
        demand += FAIR_INPUT_WEIGHT * r.prompt_len + FAIR_OUTPUT_WEIGHT * r.max_new_tokens
        times = r.token_times_s
        if times and times[0] <= end_s:  # the prompt is served by the first token's step
            served += FAIR_INPUT_WEIGHT * r.prompt_len
            served += FAIR_OUTPUT_WEIGHT * int(np.searchsorted(times, end_s, side="right"))
    return {
        "requests": len(requests), "completed": len(done),
        "median_ttft_ms": _pct(ttft, 50), "p99_ttft_ms": _pct(ttft, 99),
        "median_itl_ms": _pct(itl, 50), "p99_itl_ms": _pct(itl, 99),
        "served_tokens": served, "demand_tokens": demand,
    }


def _pct(values: np.ndarray, q: float) -> float | None:
    values = values[~np.isnan(values)]
    return float(np.percentile(values, q)) if values.size else None
