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

from sim.core import FinishReason, Request
from sim.engine import StepRecord
from sim.simulation import RunResult

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
            r.finish_detail,
        ))
    table = pd.DataFrame(rows, columns=[
        "request_id", "arrival_s", "prompt_len", "max_new_tokens", "output_len",
        "first_scheduled_s", "first_token_s", "finish_s", "num_preemptions",
        "num_cached_tokens", "finish_reason",
        "finish_detail",
    ])
    table["ttft_ms"] = (table["first_token_s"] - table["arrival_s"]) * 1e3
    table["e2el_ms"] = (table["finish_s"] - table["arrival_s"]) * 1e3
    decode_tokens = (table["output_len"] - 1).where(table["output_len"] > 1)
    table["tpot_ms"] = (table["finish_s"] - table["first_token_s"]) * 1e3 / decode_tokens
    return table


def step_table(steps: list[tuple]) -> pd.DataFrame:
    """One row per engine step (the fields of StepRecord)."""
    return pd.DataFrame.from_records(steps, columns=list(StepRecord._fields))


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
    return np.diff(flat)[keep] * 1e3


def prefix_cache_hit_rate(table: pd.DataFrame) -> float:
    """Prompt tokens found in the prefix cache at first admission, over the prompt tokens of
    every admitted request (0 when none was admitted)."""
    admitted = table[table["first_scheduled_s"].notna()]
    prompt = int(admitted["prompt_len"].sum())
    return int(admitted["num_cached_tokens"].sum()) / prompt if prompt else 0.0


def _stats(name: str, values: np.ndarray, out: dict) -> None:
    values = values[~np.isnan(values)]
    for label, q in PERCENTILES:
        if values.size == 0:
            out[f"{label}_{name}_ms"] = None
        elif q is None:
            out[f"{label}_{name}_ms"] = float(values.mean())
        else:
            out[f"{label}_{name}_ms"] = float(np.percentile(values, q))


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
    out.update(_step_summary(result))
    if slo is not None:
        good = np.ones(len(done), dtype=bool)
        if slo.ttft_ms is not None:
            good &= done["ttft_ms"].to_numpy() <= slo.ttft_ms
        if slo.tpot_ms is not None:
            good &= ~(done["tpot_ms"].to_numpy() > slo.tpot_ms)  # 1-token outputs pass
        out["goodput"] = float(good.sum()) / duration_s
    return out


def _step_summary(result: RunResult) -> dict:
    if not result.steps:
        return {"preemptions": result.num_preemptions, "num_steps": 0, "mean_batch_size": 0.0,
                "max_batch_size": 0, "mean_kv_usage": 0.0, "slot_utilization": 0.0}
    width = len(StepRecord._fields)
    flat = np.fromiter(itertools.chain.from_iterable(result.steps), dtype=float,
                       count=width * len(result.steps))
    steps = flat.reshape(-1, width)
    col = {name: i for i, name in enumerate(StepRecord._fields)}
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
