"""`vllm bench serve`'s flags with vLLM's meanings: goodput SLOs, the percentiles reported,
and the request schedule (--num-prompts, --request-rate, --burstiness) laid over a trace."""

from __future__ import annotations

import math

import numpy as np

from workloads.trace import Trace

GOODPUT_METRICS = ("ttft", "tpot", "e2el")  # vLLM's request-level SLO names
PERCENTILE_METRICS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILE_METRICS = "ttft,tpot,itl"
DEFAULT_METRIC_PERCENTILES = "99"


def parse_goodput(pairs: list[str]) -> dict[str, float]:
    """`ttft:200 tpot:50` -> {"ttft": 200.0, "tpot": 50.0}: milliseconds per metric."""
    slos: dict[str, float] = {}
    for pair in pairs:
        key, colon, value = pair.partition(":")
        try:
            bound_ms = float(value) if colon else math.nan
        except ValueError:
            bound_ms = math.nan
        if math.isnan(bound_ms):
            raise ValueError(f"--goodput {pair!r}: give KEY:VALUE pairs, the value in "
                             "milliseconds (e.g. ttft:200 tpot:50)")
        if key not in GOODPUT_METRICS:
            raise ValueError(f"--goodput {pair!r}: {key!r} is not one of "
                             f"{', '.join(GOODPUT_METRICS)}")
        if bound_ms < 0:
            raise ValueError(f"--goodput {pair!r}: the bound must be >= 0 ms")
        slos[key] = bound_ms
    return slos


def parse_percentile_metrics(text: str) -> tuple[str, ...]:
    """`ttft,tpot,itl` -> the metrics whose mean, median, std and percentiles are reported."""
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in PERCENTILE_METRICS]
    if unknown or not names:
        raise ValueError(f"--percentile-metrics {text!r}: choose from "
                         f"{', '.join(PERCENTILE_METRICS)}")
    return names


def parse_metric_percentiles(text: str) -> tuple[float, ...]:
    """`25,50,99.9` -> the percentiles reported for each selected metric."""
    try:
        values = tuple(float(value) for value in text.split(","))
    except ValueError:
        raise ValueError(f"--metric-percentiles {text!r}: give numbers, e.g. 50,90,99") from None
    if not all(0 < value < 100 for value in values):
        raise ValueError(f"--metric-percentiles {text!r}: each must be in (0, 100)")
    return values


def vllm_arrivals(count: int, rate: float, burstiness: float, seed: int) -> np.ndarray:
    """Send times (s from the run's start) as `vllm bench serve` draws them (its get_request):
    all at 0 for an infinite rate; else each request, the first included, waits a gamma
    interval after the one before (shape `burstiness`, scale 1 / (rate x burstiness), mean
    1/rate: 1 is a Poisson process, lower burstier, higher more even, infinite exactly 1/rate),
    and the times are stretched so that the last is count / rate."""
    if not rate > 0:
        raise ValueError(f"--request-rate must be > 0, got {rate}")
    if not burstiness > 0:
        raise ValueError(f"--burstiness must be > 0, got {burstiness}")
    if not 0 <= seed < 2**32:
        raise ValueError(f"--seed must be in [0, 2**32) to draw arrivals, got {seed}")
    if math.isinf(rate) or count == 0:
        return np.zeros(count)
    if math.isinf(burstiness):
        delays = np.full(count, 1.0 / rate)
    else:
        # vLLM seeds numpy's global (legacy) generator with --seed and draws one interval per
        # request from it, in order (its random dataset samples from a generator of its own):
        # a RandomState of that seed draws the same numbers.
        delays = np.random.RandomState(seed).gamma(
            shape=burstiness, scale=1.0 / (rate * burstiness), size=count)
    times = np.cumsum(delays)
    if times[-1] != 0:
        # vLLM rescales the times so the last request goes at count / rate: a run's offered
        # rate is then the one asked for, whatever the seed drew.
        times = times * (count / rate / times[-1])
    return times


def vllm_schedule(trace: Trace, num_prompts: int | None, rate: float | None,
                  burstiness: float, seed: int) -> Trace:
    """The trace's first num_prompts requests, sent at vLLM's times for `rate` (None: the
    trace's own times)."""
    if num_prompts is not None:
        if num_prompts < 1:
            raise ValueError(f"--num-prompts must be >= 1, got {num_prompts}")
        if num_prompts > len(trace):
            raise ValueError(f"--num-prompts {num_prompts}: trace {trace.name} has only "
                             f"{len(trace)} requests")
        trace = Trace(trace.name, trace.table.iloc[:num_prompts].reset_index(drop=True))
    if rate is None:
        if burstiness != 1.0:
            raise ValueError("--burstiness shapes the intervals of --request-rate; give both")
        return trace
    if trace.has_sessions:
        raise ValueError(f"--request-rate: trace {trace.name} has sessions, whose turns wait "
                         "for the answers; send it at its own times")
    arrivals = vllm_arrivals(len(trace), rate, burstiness, seed)
    # vLLM's first request waits its own interval after the run starts; a trace starts at its
    # first request, so the times count from it (the gaps are vLLM's, the first wait dropped).
    arrivals = arrivals - arrivals[0]
    return Trace(trace.name, trace.table.assign(arrival_s=arrivals))
