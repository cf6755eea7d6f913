"""One stage of the live capacity search: the trace replayed at a rate against the server,
stopped early once it certainly breaks the SLO, then the server left to drain."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import replace

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from executor.prompts import FIRST_TOKEN_ID
from servelab.bench.capacity import EarlyVerdict, RunStage
from servelab.bench.client import (
    STOPPED,
    BenchConfig,
    BenchRequest,
    bench_requests,
    run_bench,
    summarize_bench,
)
from servelab.bench.connection import make_client
from servelab.sweeps.grid import CapacitySlo
from workloads.trace import Trace
from workloads.transforms import scale_qps

DRAIN_POLL_S = 0.2
_BUSY = ("vllm:num_requests_running", "vllm:num_requests_waiting")


def trace_rate_rps(trace: Trace) -> float:
    """Requests per second over the trace's span; the rates a search scales it to."""
    if len(trace) < 2 or not trace.span_s > 0:
        raise ValueError(f"--find-capacity: trace {trace.name} has no arrival span to scale "
                         "(it needs two or more requests at different times)")
    return len(trace) / trace.span_s


def stage_runner(trace: Trace, config: BenchConfig, vocab_size: int, seed: int,
                 slo: CapacitySlo, on_request: Callable[[], None] | None = None,
                 on_start: Callable[[float, int], None] | None = None,
                 drain_s: float = 60.0) -> RunStage:
    """A RunStage replaying `trace` scaled to each rate; `on_start(rate, requests)` and
    `on_request()` drive a progress bar."""
    base_rps = trace_rate_rps(trace)
    stages = itertools.count(1)

    async def run_stage(rate_rps: float, limit_s: float) -> dict:
        scaled = scale_qps(trace, rate_rps / base_rps)
        # Fresh tokens every stage: a prompt the server cached in an earlier stage would be a
        # hit no single replay of the trace gets (the simulator starts each rate cold).
        requests = bench_requests(scaled, vocab_size, seed, salt=f"stage{next(stages)}")
        if on_start is not None:
            on_start(rate_rps, len(requests))
        verdict = EarlyVerdict(slo, len(requests),
                               sum(max(r.max_tokens - 1, 0) for r in requests))
        started_s = time.perf_counter()
        result = await run_bench(requests, replace(config, timeout_s=min(config.timeout_s,
                                                                           limit_s)),
                                 on_request, stop=verdict)
        summary = summarize_bench(result)
        stopped_early = result.cut_short == STOPPED
        row = {"rate_rps": len(scaled) / scaled.span_s, "qps_scale": rate_rps / base_rps,
               "requests": len(requests), "passed": not stopped_early and slo.met(summary),
               "stopped_early": stopped_early,
               "incomplete": result.cut_short is not None and not stopped_early,
               "duration_s": time.perf_counter() - started_s}
        row.update({k: summary[k] for k in ("completed", "failed", "p99_ttft_ms", "p99_itl_ms",
                                            "output_throughput", "request_throughput")})
        # Requests the early stop cut off are not the server's failures.
        row["stopped"] = sum(r.finish_detail == STOPPED for r in result.requests)
        row["failed"] -= row["stopped"]
        left_s = limit_s - row["duration_s"]
        if result.cut_short is not None and left_s > 0:
            await wait_until_idle(config, min(drain_s, left_s))
        return row

    return run_stage


async def warm_up(config: BenchConfig) -> None:
    """One short request before the first stage, so that stage does not pay for the first
    connection and whatever a server does on its first request."""
    first = BenchRequest("warm-up", 0.0, list(range(FIRST_TOKEN_ID, FIRST_TOKEN_ID + 16)), 2)
    result = await run_bench([first], replace(config, timeout_s=min(config.timeout_s, 60.0)))
    if result.errors:
        raise ValueError(f"{config.url}: the warm-up request failed: {result.errors[0]}")


async def wait_until_idle(config: BenchConfig, limit_s: float) -> bool:
    """Poll the server's /metrics until it runs and queues nothing (the requests a stopped
    stage left behind are aborted or done); False if it stayed busy for limit_s, or does not
    say."""
    deadline_s = time.perf_counter() + limit_s
    async with make_client(config) as client:
        while time.perf_counter() < deadline_s:
            busy = await _busy(client)
            if busy is None:
                return False
            if busy == 0:
                return True
            await asyncio.sleep(DRAIN_POLL_S)
    return False


async def _busy(client: aiohttp.ClientSession) -> float | None:
    """Requests running or waiting on the server, from /metrics; None if it exposes none."""
    try:
        async with client.get("metrics") as response:
            if response.status != 200:
                return None
            text = await response.text()
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None
    values = [s.value for f in text_string_to_metric_families(text) for s in f.samples
              if s.name in _BUSY]
    return sum(values) if values else None
