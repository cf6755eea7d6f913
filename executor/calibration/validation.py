"""Validation: a trace measured on the executor and simulated with a calibration, metric by
metric, and how the cost model priced the steps the measured runs took."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import replace

import numpy as np

from sim.cluster.closed_loop import closed_loop, replay
from sim.cost.calibrated import CalibratedCostModel
from sim.engine.core import BatchPlan
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.metrics import summarize
from sim.replay.simulation import RunResult
from sim.replay.workload import requests_from_trace
from workloads.trace import Trace

SIMULATIONS_PER_RUN = 5  # simulated runs per measured one when steps have jitter (compare)

# The metrics whose simulated value is checked against the measured one.
VALIDATED = ("output_throughput", "median_ttft_ms", "p95_ttft_ms", "p99_ttft_ms",
             "median_itl_ms", "p99_itl_ms", "median_tpot_ms", "median_e2el_ms", "p99_e2el_ms")


def overall(results: dict) -> dict:
    """Median and largest |error| over every policy and metric, and the median spread."""
    errors = [abs(e) for r in results.values() for e in r["error"].values() if e is not None]
    spreads = [v for r in results.values() for v in r["spread"].values() if v is not None]
    return {"median_abs_error": statistics.median(errors) if errors else None,
            "max_abs_error": max(errors) if errors else None,
            "median_spread": statistics.median(spreads) if spreads else None}


def signed_errors(measured: dict, simulated: dict) -> dict:
    """(simulated - measured) / measured per validated metric (None where undefined)."""
    errors = {}
    for key in VALIDATED:
        m, s = measured.get(key), simulated.get(key)
        errors[key] = None if m in (None, 0) or s is None else (s - m) / m
    return errors


def measure_runs(trace: Trace, configs: dict[str, SchedulerConfig], model, seed: int = 0,
                 on_step=None, repeats: int = 1, before_each=None,
                 step_logs: dict[str, list] | None = None,
                 on_backend=None, open_loop: bool = False) -> dict[str, list[RunResult]]:
    """Each policy's config run `repeats` times on `model`, in A B .. B A order so a slow
    spell of a shared machine hits every policy alike; before_each(policy, k) runs before
    the policy's k-th run, on_backend(backend) once its backend is made. step_logs, if
    given, gets per policy a list of each run's executed (plan, seconds). Sessions run
    closed-loop (sim.cluster.closed_loop) unless open_loop."""
    from executor.replay import measured_run

    measured: dict[str, list[RunResult]] = {policy: [] for policy in configs}
    for round_ in range(repeats):
        order = list(configs) if round_ % 2 == 0 else list(reversed(configs))
        for policy in order:
            if before_each is not None:
                before_each(policy, round_)
            log = None
            if step_logs is not None:
                step_logs.setdefault(policy, []).append(log := [])
            requests = requests_from_trace(trace)
            loop = closed_loop(trace, requests, open_loop=open_loop)
            measured[policy].append(measured_run(requests, configs[policy], model, seed,
                                                 on_step, log, on_backend, loop))
    return measured


def compare(trace: Trace, configs: dict[str, SchedulerConfig],
            measured: dict[str, list[RunResult]], cost_model: CalibratedCostModel,
            step_logs: dict[str, list] | None = None,
            speeds: dict[str, list[float]] | None = None, open_loop: bool = False
            ) -> tuple[dict, dict[str, tuple[RunResult, RunResult]]]:
    """Each policy simulated with `cost_model` against its measured runs: per policy the two
    summaries (each metric's median over the measured runs, and over SIMULATIONS_PER_RUN
    times as many simulated ones when the cost model has step jitter), the signed errors
    and the measured runs' `spread` ((max - min) / median: how far the machine moves one
    measurement), with step_logs (measure_runs) its `steps` (in_run_step_error); and the
    (first measured, first simulated) runs. speeds (measure_interleaved), if given, is how
    slow the machine ran during each measured run: that run's simulations and its steps'
    prices are scaled by it (kept as each policy's `speeds`). Sessions run closed-loop, as
    the measured runs sent them, unless open_loop."""
    results, runs = {}, {}
    per_run = SIMULATIONS_PER_RUN if cost_model.jitter else 1
    for policy, config in configs.items():
        # SIMULATIONS_PER_RUN simulated runs per measured one (each a different jitter seed:
        # another equally likely run), medians compared with medians: the prediction of a
        # median, without a few jitter draws' own noise added to the machine's.
        run_speeds = (speeds or {}).get(policy) or [1.0] * len(measured[policy])
        varied = cost_model.jitter or len(set(run_speeds)) > 1
        count = len(run_speeds) * per_run if varied else 1
        simulations = [replay(trace, requests_from_trace(trace), Engine(Scheduler(config),
                              replace(cost_model.scaled(run_speeds[k // per_run]),
                                      jitter_seed=k)), open_loop=open_loop)
                       for k in range(count)]
        m, spread = median_summary([summarize(run) for run in measured[policy]])
        s, _ = median_summary([summarize(run) for run in simulations])
        results[policy] = {"measured": m, "simulated": s, "error": signed_errors(m, s),
                           "spread": spread}
        if speeds is not None:
            results[policy]["speeds"] = list(run_speeds)
            # One speed per run, from the run's start (kept in the window form it had).
            results[policy]["speed_windows"] = [[[0.0, speed]] for speed in run_speeds]
        if step_logs and step_logs.get(policy):
            # Each run's steps at the machine's speed then: seconds / speed vs the model.
            steady = [(plan, seconds / speed)
                      for log, speed in zip(step_logs[policy], run_speeds, strict=True)
                      for plan, seconds in log]
            results[policy]["steps"] = in_run_step_error(cost_model, steady)
        runs[policy] = (measured[policy][0], simulations[0])
    return results, runs


def median_summary(summaries: list[dict]) -> tuple[dict, dict]:
    """The first summary with each validated metric replaced by its median over all, and
    each metric's spread (max - min) / median (0 for one run, None where undefined)."""
    merged, spread = dict(summaries[0]), {}
    for key in VALIDATED:
        values = [s[key] for s in summaries if s.get(key) is not None]
        if len(values) < len(summaries):
            spread[key] = None
            continue
        middle = statistics.median(values)
        merged[key] = middle
        spread[key] = (max(values) - min(values)) / middle if middle else None
    return merged, spread


# Kinds of step `in_run_step_error` reports on; small decodes are where ITL medians live.
SMALL_DECODE_ROWS = 13
STEP_KINDS = (f"decode, 1-{SMALL_DECODE_ROWS} rows", f"decode, {SMALL_DECODE_ROWS + 1}+ rows",
              "static, with padding", "with a prefill chunk")


def step_kind(plan: BatchPlan) -> str:
    """Which of STEP_KINDS a plan is."""
    if plan.prefill_tokens:
        return STEP_KINDS[3]
    if plan.padding:
        return STEP_KINDS[2]
    return STEP_KINDS[0] if plan.decode_seqs <= SMALL_DECODE_ROWS else STEP_KINDS[1]


def in_run_step_error(model: CalibratedCostModel, steps: Iterable[tuple[BatchPlan, float]]
                      ) -> dict[str, dict]:
    """How the model prices the steps a measured run actually took: per STEP_KINDS present,
    the step count, the median of measured / predicted, the kind's measured seconds over its
    predicted ones, and its share of the measured busy time."""
    grouped: dict[str, list[tuple[float, float]]] = {}
    for plan, seconds in steps:
        predicted = model.predict(plan)
        if predicted > 0:
            grouped.setdefault(step_kind(plan), []).append((seconds, predicted))
    busy = sum(seconds for pairs in grouped.values() for seconds, _ in pairs)
    result = {}
    for kind in STEP_KINDS:
        if kind in grouped:
            measured, predicted = np.asarray(grouped[kind]).T
            result[kind] = {"steps": len(measured),
                            "median_ratio": float(np.median(measured / predicted)),
                            "time_ratio": float(measured.sum() / predicted.sum()),
                            "time_share": float(measured.sum() / busy)}
    return result
