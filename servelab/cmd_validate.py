"""`servelab validate`: one trace measured on the executor and simulated with a calibration.

Prints, per policy, the signed relative error (simulated - measured) / measured of each
metric: the simulator's accuracy as a number, not a claim. Then how the cost model priced the
steps the measured runs took, by kind: where an end-to-end error comes from.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from servelab.cmd_calibrate import (
    Fit,
    calibration_meta,
    fit_profile,
    profile_backend,
    save_calibration,
)
from servelab.model_args import add_model_args, load_model_from_args
from servelab.sim_args import (
    add_scheduler_args,
    parse_policies,
    scheduler_config,
    write_json_atomic,
)
from servelab.trace_args import add_trace_args, load_trace_from_args
from servelab.validate_output import (
    VALIDATED,
    format_errors,
    format_overall,
    format_speeds,
    format_steps,
    overall,
    write_out,
)
from sim.calibrated import CalibratedCostModel, Drift, in_run_step_error, speed_at
from sim.engine import Engine
from sim.metrics import summarize
from sim.scheduler import Scheduler, SchedulerConfig
from sim.simulation import RunResult, run_trace
from sim.workload import requests_from_trace
from workloads.trace import Trace

SIMULATIONS_PER_RUN = 5  # simulated runs per measured one when steps have jitter (compare)


def register(subparsers: argparse._SubParsersAction) -> None:
    val = subparsers.add_parser("validate", help="measured vs simulated on one trace")
    add_trace_args(val, positional=False)
    val.add_argument("--policies", default="static,continuous,recompute,chunked")
    cal = val.add_mutually_exclusive_group(required=True)
    cal.add_argument("--cost-model", type=Path, help="calibration JSON")
    cal.add_argument("--calibrate", type=Path, metavar="FILE",
                     help="calibrate in the same session instead: the profile grid timed a "
                          "shape at a time between the measured runs' steps, fitted and "
                          "written to FILE, so the calibration sees the machine the runs saw")
    val.add_argument("--repeats", type=int, default=1,
                     help="measured runs per policy, in A B .. B A order; medians are compared "
                          "and the runs' spread is printed as the machine's noise floor")
    add_scheduler_args(val)
    add_model_args(val)
    val.add_argument("--json", type=Path, default=None, help="write the result as JSON")
    val.add_argument("--out", type=Path, default=None, help="CDF overlays and error table")
    val.set_defaults(func=_run)


def signed_errors(measured: dict, simulated: dict) -> dict:
    """(simulated - measured) / measured per validated metric (None where undefined)."""
    errors = {}
    for key in VALIDATED:
        m, s = measured.get(key), simulated.get(key)
        errors[key] = None if m in (None, 0) or s is None else (s - m) / m
    return errors


def _run(args: argparse.Namespace) -> int:
    policies = parse_policies(args.policies)
    if args.repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {args.repeats}")
    cost_model = None if args.cost_model is None else CalibratedCostModel.load(args.cost_model)
    trace = load_trace_from_args(args)
    loaded = load_model_from_args(args)
    num_blocks = loaded.kv_blocks(args.block_size, args.kv_cache_gib)
    max_len = loaded.max_model_len(args.max_model_len)
    configs = {p: scheduler_config(args, p, num_blocks, max_len) for p in policies}
    profile = None
    if args.calibrate is not None:
        from executor.profile import GridProfile

        backend, points, *_ = profile_backend(loaded, args.block_size, args.kv_cache_gib,
                                              args.max_model_len)
        profile = GridProfile(backend, points, args.seed)
    runs_total = len(policies) * args.repeats
    warm_up = 0 if profile is None else len(profile.points)  # interleaved shapes: not counted
    bar = tqdm(total=len(trace) * runs_total + warm_up, file=sys.stderr, leave=False,
               disable=None)

    def on_step(_now: float, done: list) -> None:
        bar.update(len(done))

    step_logs: dict[str, list] = {}
    speeds = None  # with --cost-model, nothing times the machine during the runs
    if profile is None:
        measured = measure_runs(trace, configs, loaded.model, args.seed, on_step, args.repeats,
                                step_logs=step_logs)
    else:
        measured, fit, speeds = measure_and_calibrate(
            trace, configs, loaded.model, profile, args.seed, on_step, lambda: bar.update(1),
            args.repeats, step_logs)
        cost_model = save_calibration(fit, args.calibrate, calibration_meta(
            args, loaded, num_blocks, max_len, len(profile.points), len(profile.times)))
    bar.close()
    results, runs = compare(trace, configs, measured, cost_model, step_logs, speeds)
    one_speed = run_speed = None  # the same runs simulated at the session's usual speed
    if speeds is not None:  # throughout, and each at its run's speed throughout
        one_speed = overall(compare(trace, configs, measured, cost_model)[0])
        steady = {policy: [RunSpeed.steady(s.overall) for s in runs]
                  for policy, runs in speeds.items()}
        run_speed = overall(compare(trace, configs, measured, cost_model, speeds=steady)[0])
    source = args.cost_model or f"{args.calibrate} (calibrated during the measured runs)"
    print(f"trace {trace.name}: {len(trace)} requests; model {loaded.name} on {loaded.device} "
          f"({loaded.threads} threads); cost model {source}")
    if profile is not None:
        print(fit.describe())
        print(f"grid timings on the measured runs' own backends: {profile.borrowed} of "
              f"{profile.times.size}")
    print(format_errors(results))
    print(format_overall(results))
    if speeds is not None:
        print(format_speeds(speeds, SPEED_WINDOW_S))
        for label, other in (("each run at its own speed throughout", run_speed),
                             ("at one speed throughout", one_speed)):
            print(f"simulated {label} instead: median |error| "
                  f"{other['median_abs_error']:.1%}, largest {other['max_abs_error']:.1%}")
    if steps := format_steps(results):
        print(steps)
    if args.out is not None:
        write_out(args.out, trace.name, results, runs)
    if args.json is not None:
        write_json_atomic(args.json, {
            "trace": {"name": trace.name, "requests": len(trace), "span_s": trace.span_s},
            "config": {"model": loaded.name, "device": str(loaded.device),
                       "cost_model": str(args.cost_model or args.calibrate),
                       "calibrated_during_runs": profile is not None,
                       "num_blocks": num_blocks},
            "results": results, "overall": overall(results), "repeats": args.repeats,
            "overall_at_run_speeds": run_speed, "overall_at_one_speed": one_speed,
        })
    return 0


def measure_runs(trace: Trace, configs: dict[str, SchedulerConfig], model, seed: int = 0,
                 on_step=None, repeats: int = 1, before_each=None,
                 step_logs: dict[str, list] | None = None,
                 on_backend=None) -> dict[str, list[RunResult]]:
    """Each policy's config run `repeats` times on `model`, in A B .. B A order so a slow
    spell of a shared machine hits every policy alike; before_each(policy, k) runs before
    the policy's k-th run, on_backend(backend) once its backend is made. step_logs, if
    given, gets per policy a list of each run's executed (plan, seconds)."""
    from executor.replay import measured_run

    prefixes = trace.table["prefix_hash_ids"].tolist() if trace.has_prefix_hashes else None
    measured: dict[str, list[RunResult]] = {policy: [] for policy in configs}
    for round_ in range(repeats):
        order = list(configs) if round_ % 2 == 0 else list(reversed(configs))
        for policy in order:
            if before_each is not None:
                before_each(policy, round_)
            log = None
            if step_logs is not None:
                step_logs.setdefault(policy, []).append(log := [])
            measured[policy].append(measured_run(requests_from_trace(trace), configs[policy],
                                                 model, seed, prefixes, on_step, log,
                                                 on_backend))
    return measured


# validate --calibrate keeps the profile grid's time near this share of the measured runs'.
GRID_SHARE = 1.0
# The grid's timings during a run are grouped in windows of this much of the run's clock,
# each the machine's speed then, if it holds SPEED_WINDOW_MIN timings (else the run's). A
# shared machine's speed moves within a run too: one code run ran at 1.05 as a whole, one of
# its windows at 2.20 (README, session H).
SPEED_WINDOW_S = 5.0
SPEED_WINDOW_MIN = 20


class RunSpeed(NamedTuple):
    """How slow the machine ran during one measured run: over all of it (the median of the
    grid's timings then, over their shapes' medians) and window by window (Drift)."""

    overall: float
    windows: Drift

    @classmethod
    def steady(cls, factor: float) -> RunSpeed:
        """The same speed throughout."""
        return cls(factor, ((0.0, factor),))


class Interleaved:
    """Times the profile grid (an executor.profile.GridProfile) a shape at a time between a
    measured run's steps, keeping the grid's time near `share` x the runs' time, so the
    calibration samples the machine at the moments the runs do (a shared machine's speed
    drifts by 10-30% over minutes; timed inside a run, a shape costs what the run's own step
    of that shape does: benchmarks/profile_vs_run.py), on the run's own backend where the
    shape fits in its free KV blocks (`use_backend`). A run's clock advances by its own
    steps alone (measured_run), so the shapes in between change none of its metrics."""

    def __init__(self, profile, share: float = GRID_SHARE, on_step=None) -> None:
        self.profile, self.share, self.then = profile, share, on_step
        self.run: tuple | None = None
        self.run_s = self.grid_s = 0.0
        self._mark = time.perf_counter()

    def start_run(self, *run) -> None:
        """Call before each run (naming it: the grid's timings are tagged with it and the
        SPEED_WINDOW_S window of its clock they fell in until the next): the time since the
        last step was not the runs'."""
        self.run = run or None
        self.profile.tag = (*run, 0.0) if run else None
        self._mark = time.perf_counter()

    def use_backend(self, backend) -> None:
        """Time shapes on the run's backend (measure_runs' on_backend): in a second KV
        pool, code's static steps took 2.6% longer than in the run's (profile_vs_run.py)."""
        self.profile.use(backend)

    def on_step(self, now: float, done: list) -> None:
        """After each run step (ending at `now` on the run's clock): time grid shapes until
        the grid has its share again."""
        if self.then is not None:
            self.then(now, done)
        self.run_s += time.perf_counter() - self._mark
        if self.run is not None:
            self.profile.tag = (*self.run, SPEED_WINDOW_S * (now // SPEED_WINDOW_S))
        while self.grid_s < self.share * self.run_s:
            start = time.perf_counter()
            self.profile.run_next()
            self.grid_s += time.perf_counter() - start
        self._mark = time.perf_counter()


def measure_and_calibrate(trace: Trace, configs: dict[str, SchedulerConfig], model, profile,
                          seed: int = 0, on_step=None, on_run=None, repeats: int = 1,
                          step_logs: dict[str, list] | None = None
                          ) -> tuple[dict[str, list[RunResult]], Fit, dict[str, list[RunSpeed]]]:
    """measure_runs with the profile grid (an executor.profile.GridProfile) timed in the same
    session: a warm-up round, then shapes between the runs' steps (Interleaved), the last
    round completed after them (two rounds at least, for the step jitter). Returns the runs,
    the cost model fitted to those rounds, and per policy each run's RunSpeed: how slow the
    machine ran the grid's shapes during that run and each window of it (relative_speeds,
    window_speeds; 1 for a run too short to time one). on_run: after each warm-up shape."""
    from executor.profile import relative_speeds, window_speeds

    profile.run_round(timed=False, on_run=on_run)
    mixed = Interleaved(profile, on_step=on_step)
    measured = measure_runs(trace, configs, model, seed, mixed.on_step, repeats,
                            mixed.start_run, step_logs, mixed.use_backend)
    profile.tag = None  # after the runs, at home
    profile.use(None)
    profile.finish()
    tags = profile.round_tags
    by_tag = window_speeds(profile.times, tags, SPEED_WINDOW_MIN)
    slowness = [[by_tag[tag] for tag in row] for row in tags]
    by_run = relative_speeds(profile.times, [[tag and tag[:-1] for tag in row] for row in tags])
    speeds = {policy: [RunSpeed(by_run.get((policy, k), 1.0),
                                tuple(sorted((tag[-1], speed) for tag, speed in by_tag.items()
                                             if tag and tag[:-1] == (policy, k))) or ((0.0, 1.0),))
                       for k in range(len(runs))]
              for policy, runs in measured.items()}
    return measured, fit_profile(profile.plans, profile.times, slowness), speeds


def compare(trace: Trace, configs: dict[str, SchedulerConfig],
            measured: dict[str, list[RunResult]], cost_model: CalibratedCostModel,
            step_logs: dict[str, list] | None = None,
            speeds: dict[str, list[RunSpeed]] | None = None
            ) -> tuple[dict, dict[str, tuple[RunResult, RunResult]]]:
    """Each policy simulated with `cost_model` against its measured runs: per policy the two
    summaries (each metric's median over the measured runs, and over SIMULATIONS_PER_RUN
    times as many simulated ones when the cost model has step jitter), the signed errors
    and the measured runs' `spread` ((max - min) / median: how far the machine moves one
    measurement), with step_logs (measure_runs) its `steps` (in_run_step_error); and the
    (first measured, first simulated) runs. speeds (measure_and_calibrate), if given, is
    how slow the machine ran during each measured run, window by window: that run's
    simulations scale each step by the speed in force when it was scheduled, and its steps
    are priced at it (kept as each policy's `speeds` and `speed_windows`)."""
    results, runs = {}, {}
    per_run = SIMULATIONS_PER_RUN if cost_model.jitter else 1
    for policy, config in configs.items():
        # SIMULATIONS_PER_RUN simulated runs per measured one (each a different jitter seed:
        # another equally likely run), medians compared with medians: the prediction of a
        # median, without a few jitter draws' own noise added to the machine's.
        run_speeds = (speeds or {}).get(policy) or [RunSpeed.steady(1.0)] * len(measured[policy])
        varied = cost_model.jitter or len(set(run_speeds)) > 1
        count = len(run_speeds) * per_run if varied else 1
        simulations = [run_trace(requests_from_trace(trace), Engine(Scheduler(config), replace(
                           cost_model.drifting(run_speeds[k // per_run].windows), jitter_seed=k)))
                       for k in range(count)]
        m, spread = _median_summary([summarize(run) for run in measured[policy]])
        s, _ = _median_summary([summarize(run) for run in simulations])
        results[policy] = {"measured": m, "simulated": s, "error": signed_errors(m, s),
                           "spread": spread}
        if speeds is not None:
            results[policy]["speeds"] = [speed.overall for speed in run_speeds]
            results[policy]["speed_windows"] = [[list(w) for w in speed.windows]
                                                for speed in run_speeds]
        if step_logs and step_logs.get(policy):
            # Each run's steps at the machine's speed then: seconds / speed vs the model.
            steady = [(plan, seconds / speed_at(speed.windows, plan.scheduled_s))
                      for log, speed in zip(step_logs[policy], run_speeds, strict=True)
                      for plan, seconds in log]
            results[policy]["steps"] = in_run_step_error(cost_model, steady)
        runs[policy] = (measured[policy][0], simulations[0])
    return results, runs


def _median_summary(summaries: list[dict]) -> tuple[dict, dict]:
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
