"""`vllm bench serve`'s result: its JSON keys and its printed block, from the client's records.

Counts, duration and throughputs are the summary's own (sim.replay.metrics.summarize), so
the two reports agree; vLLM's extras are computed here: mean, median, std and the chosen
percentiles of each chosen metric, goodput under its SLOs, peak output tokens per second and
peak concurrent requests (both over one-second buckets of the run).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from sim.engine.core import Request
from sim.replay.metrics import inter_token_latencies_ms, request_table

# metric -> (vLLM's short name, its section header)
METRIC_NAMES = {"ttft": ("TTFT", "Time to First Token"),
                "tpot": ("TPOT", "Time per Output Token (excl. 1st token)"),
                "itl": ("ITL", "Inter-token Latency"),
                "e2el": ("E2EL", "End-to-end Latency")}
_DONE = ("length", "stop")


@dataclass(frozen=True)
class VllmReport:
    """What `vllm bench serve` was asked to report."""

    metrics: tuple[str, ...] = ("ttft", "tpot", "itl")  # --percentile-metrics
    percentiles: tuple[float, ...] = (99.0,)  # --metric-percentiles
    goodput_ms: tuple[tuple[str, float], ...] = ()  # --goodput, (metric, bound ms) pairs


def vllm_metrics(requests: list[Request], summary: dict, report: VllmReport) -> dict:
    """vLLM's result keys for a run: counts and throughputs, then each chosen metric's."""
    table = request_table(requests)
    done = table[table["finish_reason"].isin(_DONE)]
    duration_s = summary["duration_s"]
    out = {"duration": duration_s, "completed": summary["completed"],
           "failed": len(requests) - summary["completed"],
           "total_input_tokens": summary["total_input"],
           "total_output_tokens": summary["total_output"],
           "request_throughput": summary["request_throughput"],
           "request_goodput": (_good(done, dict(report.goodput_ms)) / duration_s
                               if report.goodput_ms else None),
           "output_throughput": summary["output_throughput"],
           "total_token_throughput": summary["total_token_throughput"]}
    out.update(_peaks(done, requests))
    values = {"ttft": done["ttft_ms"], "tpot": done["tpot_ms"].dropna(),
              "itl": inter_token_latencies_ms(requests), "e2el": done["e2el_ms"]}
    for metric in report.metrics:
        out.update(_metric_keys(metric, np.asarray(values[metric], dtype=float),
                                report.percentiles))
    return out


def _good(done: pd.DataFrame, bounds_ms: dict[str, float]) -> int:
    """Completed requests within every bound (vLLM: a 1-token output's TPOT is 0)."""
    good = np.ones(len(done), dtype=bool)
    for metric, bound_ms in bounds_ms.items():
        good &= done[f"{metric}_ms"].fillna(0.0).to_numpy() <= bound_ms
    return int(good.sum())


def _metric_keys(metric: str, values: np.ndarray, percentiles: Sequence[float]) -> dict:
    """mean_, median_, std_ and p<q>_ keys in ms; 0 for no values, as vLLM writes them."""
    if values.size == 0:
        values = np.zeros(1)
    out = {f"mean_{metric}_ms": float(values.mean()),
           f"median_{metric}_ms": float(np.median(values)),
           f"std_{metric}_ms": float(values.std())}
    for q, value in zip(percentiles, np.percentile(values, percentiles), strict=True):
        out[f"p{percentile_word(q)}_{metric}_ms"] = float(value)
    return out


def percentile_word(q: float) -> str:
    """99 -> "99", 99.9 -> "99.9": how vLLM spells a percentile in its keys."""
    return str(int(q)) if int(q) == q else str(q)


def _peaks(done: pd.DataFrame, requests: list[Request]) -> dict:
    """Most output tokens in one second of the run, and most requests in flight in one."""
    ids = set(done["request_id"])
    runs = [r for r in requests if r.request_id in ids and r.finish_s is not None]
    if not runs:
        return {"max_output_tokens_per_s": 0.0, "max_concurrent_requests": 0}
    start_s = min(r.arrival_s for r in runs)
    seconds = int(np.ceil(max(r.finish_s for r in runs) - start_s)) + 1
    tokens, in_flight = np.zeros(seconds), np.zeros(seconds)
    for r in runs:
        buckets = (np.asarray(r.token_times_s) - start_s).astype(int)
        np.add.at(tokens, buckets[(buckets >= 0) & (buckets < seconds)], 1)
        in_flight[int(r.arrival_s - start_s):int(r.finish_s - start_s) + 1] += 1
    return {"max_output_tokens_per_s": float(tokens.max()),
            "max_concurrent_requests": int(in_flight.max())}


def format_vllm_result(result: dict, report: VllmReport, max_concurrency: int | None,
                       rate: float | None) -> str:
    """The block `vllm bench serve` prints, from vllm_metrics' keys."""
    lines = [f"{' Serving Benchmark Result ':=^50}"]

    def row(label: str, value: float | int, spec: str = "") -> None:
        lines.append(f"{label:<40} {value:<10{spec}}")

    row("Successful requests:", result["completed"])
    row("Failed requests:", result["failed"])
    if max_concurrency is not None:
        row("Maximum request concurrency:", max_concurrency)
    if rate is not None:
        row("Request rate configured (RPS):", rate, ".2f")
    row("Benchmark duration (s):", result["duration"], ".2f")
    row("Total input tokens:", result["total_input_tokens"])
    row("Total generated tokens:", result["total_output_tokens"])
    row("Request throughput (req/s):", result["request_throughput"], ".2f")
    if result["request_goodput"] is not None:
        row("Request goodput (req/s):", result["request_goodput"], ".2f")
    row("Output token throughput (tok/s):", result["output_throughput"], ".2f")
    row("Peak output token throughput (tok/s):", result["max_output_tokens_per_s"], ".2f")
    row("Peak concurrent requests:", result["max_concurrent_requests"], ".2f")
    row("Total Token throughput (tok/s):", result["total_token_throughput"], ".2f")
    for metric in report.metrics:
        name, header = METRIC_NAMES[metric]
        lines.append(f"{header:-^50}")
        row(f"Mean {name} (ms):", result[f"mean_{metric}_ms"], ".2f")
        row(f"Median {name} (ms):", result[f"median_{metric}_ms"], ".2f")
        for q in report.percentiles:
            word = percentile_word(q)
            row(f"P{word} {name} (ms):", result[f"p{word}_{metric}_ms"], ".2f")
    lines.append("=" * 50)
    return "\n".join(lines)


def saved_result(metrics: dict, header: dict, ours: dict) -> dict:
    """--save-result's JSON: vLLM's header keys (date, endpoint_type, model_id, num_prompts,
    request_rate, burstiness, max_concurrency, ...), its metric keys, and under "servelab"
    the --json payload."""
    return {**header, **metrics, "servelab": ours}


def result_filename(label: str, rate: float | str, max_concurrency: int | None,
                    model_id: str, date: str) -> str:
    """vLLM's default name: <label>-<rate>qps[-concurrency<N>]-<model>-<date>.json."""
    concurrency = f"-concurrency{max_concurrency}" if max_concurrency is not None else ""
    return f"{label}-{rate}qps{concurrency}-{model_id.split('/')[-1]}-{date}.json"
