"""Speculative decoding on the CPU lab, simulated against measured in one sitting: n-gram and a
draft model (the target's first layer) at three load levels, on one trace and one scheduler.

At each level, plain and speculative measured runs alternate (plain, n-gram, draft model,
plain, ...) for --pairs rounds, so a slow spell of a shared machine falls on all of them. Each
pair gives a TPOT speedup (plain mean TPOT / speculative) and a throughput speedup
(speculative output tokens/s / plain); their median and spread are the measurement and its
noise floor. The model's step shapes (verify steps included, none of more sequences than
--max-num-seqs) and its drafter's passes are timed in --repeats rounds spread evenly between
the pairs of all levels, so the calibration sees the machine the runs saw. The simulator then
replays the same trace under the same scheduler config on the calibration, plain and
speculative, each request's acceptance taken from the first speculative run's record
(`acceptance_rates` naming it, as `servelab simulate` reads it: its drafts replayed at the
output tokens where they came), once per measured pair with another seed of the
calibration's step jitter; the simulated figures are the medians over those runs.

    python benchmarks/fidelity/speculative_lab.py --trace azure-conv

prints the CPU, the calibration, and per method and level: the measured speedups (median,
min-max over the pairs), the simulated ones, simulated / measured, the TPOT speedup simulated
with each request drawn at its own counters instead of its drafts replayed ("counters") and
with every request at the run's average acceptance ("average"), the mean TPOTs behind the
speedups, and where speculation stops paying.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from run_args import add_run_args, trace_and_model, trace_from_args  # noqa: E402
from speculative_report import METHODS, Level, report  # noqa: E402

from executor.calibration.fit import fit_profile, profile_backend  # noqa: E402
from executor.loading import LoadedModel, cpu_model  # noqa: E402
from executor.profile import GridProfile  # noqa: E402
from executor.replay import measured_run  # noqa: E402
from executor.speculative.profile import (  # noqa: E402
    drafter_pass_profile,
    fit_drafter_passes,
)
from sim.cluster.closed_loop import closed_loop  # noqa: E402
from sim.cost.calibrated import CalibratedCostModel  # noqa: E402
from sim.cost.drafter import SpeculativeCostModel, TargetPricing, drafter_cost  # noqa: E402
from sim.engine.core import Backend, SamplingParams  # noqa: E402
from sim.engine.scheduler import Scheduler  # noqa: E402
from sim.engine.scheduler_config import DEFAULT_POLICY, SchedulerConfig  # noqa: E402
from sim.engine.speculation.config import DRAFTER_METHODS, SpeculativeConfig  # noqa: E402
from sim.engine.speculation.report import speculation_summary, speedups  # noqa: E402
from sim.policy_runs import simulate_policy  # noqa: E402
from sim.replay.metrics import summarize  # noqa: E402
from sim.replay.workload import requests_from_trace  # noqa: E402
from sim.specs.model_config import resolve_model  # noqa: E402
from workloads import Trace  # noqa: E402


class Calibration:
    """The executor's step shapes and its drafter's passes, timed in rounds spread over the
    measured runs, so a slow spell of a shared machine lands on the runs and the calibration
    alike."""

    def __init__(self, loaded: LoadedModel, args: argparse.Namespace, pairs: int) -> None:
        self.loaded = loaded
        self.backend, points, _, max_len = profile_backend(
            loaded, args.block_size, args.kv_cache_gib, None, speculative=True,
            max_num_seqs=args.max_num_seqs)
        self.profile = GridProfile(self.backend, points, args.seed)
        self.passes, self.pass_points = drafter_pass_profile(
            self.backend, max_len, args.max_num_seqs, seed=args.seed)
        self.pass_times: dict[int, list] = {n: [] for n in self.passes.drafters}
        self.profile.run_round(timed=False)
        self.passes.run_round(self.pass_points)
        self.rounds, self.pairs, self.done = args.repeats, pairs, 0

    def _round(self) -> None:
        self.profile.run_round()
        self.passes.run_round(self.pass_points, self.pass_times)

    def pair_done(self) -> None:
        """After each of the `pairs` measured pairs: a timed round where its share falls."""
        self.done += 1
        if self.done * self.rounds // self.pairs > (self.done - 1) * self.rounds // self.pairs:
            self._round()

    def fit(self) -> CalibratedCostModel:
        """The cost model of the rounds timed (at least two), with the drafter's passes."""
        while len(self.profile.rounds) < 2:
            self._round()
        fit = fit_profile(self.profile.plans, self.profile.times,
                          row_knots=self.backend.row_knots)
        passes = fit_drafter_passes(self.backend, self.pass_points, self.pass_times)
        print(f"calibration: {len(self.profile.points)} step shapes and "
              f"{passes['profiled_passes']} drafter passes x {len(self.profile.times)} rounds "
              f"between the runs; held-out step error median {np.median(fit.held_error):.1%}, "
              f"drafter fit error {passes['fit_error_median']}")
        return replace(fit.model, meta={"model": self.loaded.name, "drafter_passes": passes})


class PricedSteps(list):
    """A run's step log that prices each step as it is logged: the executor logs a step
    after running it and before the scheduler applies it, so the plan's requests are as the
    step saw them (a cost model that reads rows, the drafter's KV mirror, needs that)."""

    def __init__(self, pricing: Backend) -> None:
        super().__init__()
        self.pricing = pricing
        self.measured_s = 0.0
        self.priced_s = 0.0

    def append(self, step: tuple) -> None:
        plan, seconds = step
        self.measured_s += seconds
        self.priced_s += self.pricing.execute(plan).duration_s


def measured(trace: Trace, config: SchedulerConfig, loaded: LoadedModel, seed: int,
             pricing: Backend | None = None) -> dict:
    """One measured run's summary; with speculation, its counters and per-request record;
    with `pricing`, its steps' priced sum over their measured sum (pricing between steps
    touches memory a step would find in cache, so the runs that measure speedups do not)."""
    requests = requests_from_trace(trace, SamplingParams(seed=seed), seed_requests=True)
    schedulers: list[Scheduler] = []
    steps = None if pricing is None else PricedSteps(pricing)
    result = measured_run(requests, config, loaded.model, seed, step_log=steps,
                          loop=closed_loop(trace, requests),
                          on_scheduler=lambda s: schedulers.append(_recording(s)))
    summary = summarize(result)
    if steps is not None:
        summary["steps_priced_over_measured"] = steps.priced_s / steps.measured_s
    if config.speculative is not None:
        summary.update(speculation_summary(schedulers[0].speculator, summary, summary))
    return summary


def _recording(scheduler: Scheduler) -> Scheduler:
    """The scheduler, its speculation (if on) keeping each request's counters."""
    if scheduler.speculator is not None:
        scheduler.speculator.record_requests = True
    return scheduler


def simulated(trace: Trace, config: SchedulerConfig, record: dict, method: str,
              cost: CalibratedCostModel, workdir: Path, seeds: int) -> dict[str, float]:
    """Simulated speedups and mean TPOTs, acceptance from a measured run's record: each the
    median over `seeds` runs of the calibration's step jitter (one seed a measured pair)."""
    path = workdir / f"{method}.json"
    path.write_text(json.dumps({"results": {config.policy: record}}))
    spec = SpeculativeConfig.from_json(json.dumps({**METHODS[method],
                                                   "acceptance_rates": str(path)}))
    # The same, each request drawn at its own counters (its drafts not replayed), and every
    # request drawn at the run's average rates (no per-request record).
    recorded = spec.recorded
    counters = replace(spec, recorded=replace(recorded, by_request=tuple(
        (rid, replace(counts, drafts=())) for rid, counts in recorded.by_request)))
    runs = []
    for seed in range(seeds):
        jittered = replace(cost, jitter_seed=seed)
        plain = simulate_policy(trace, config, jittered, None, False).summary
        sped = _simulate_speculative(trace, config, spec, jittered)
        drawn = _simulate_speculative(trace, config, counters, jittered)
        average = _simulate_speculative(trace, config, replace(spec, recorded=None), jittered)
        runs.append({**speedups(sped, plain), "plain_tpot_ms": plain["mean_tpot_ms"],
                     "spec_tpot_ms": sped["mean_tpot_ms"],
                     "counters_tpot_speedup": speedups(drawn, plain)["spec_tpot_speedup"],
                     "average_tpot_speedup": speedups(average, plain)["spec_tpot_speedup"]})
    return {key: float(np.median([run[key] for run in runs])) for key in runs[0]}


def _simulate_speculative(trace: Trace, config: SchedulerConfig, spec: SpeculativeConfig,
                          cost: CalibratedCostModel) -> dict:
    """The summary of the speculative simulation (a drafter priced from the calibration)."""
    backend, spec = speculative_pricing(spec, cost)
    return simulate_policy(trace, replace(config, speculative=spec), backend, None,
                           False).summary


def speculative_pricing(spec: SpeculativeConfig, cost: CalibratedCostModel
                        ) -> tuple[Backend, SpeculativeConfig]:
    """What prices a speculative run on the calibration (as `servelab simulate` composes
    it): the verify floor, and a drafter's passes from the calibration's drafter passes."""
    if spec.method not in DRAFTER_METHODS:
        return SpeculativeCostModel(cost), spec
    target = TargetPricing(cost, resolve_model(cost.meta["model"]), None)
    return (SpeculativeCostModel(cost, drafter_cost(spec, target)),
            replace(spec, drafter_priced=True))


def _specs(args: argparse.Namespace) -> dict[str, SpeculativeConfig]:
    return {m: SpeculativeConfig.from_json(json.dumps(METHODS[m]))
            for m in args.methods.split(",")}


def measure_level(args: argparse.Namespace, loaded: LoadedModel, scale: float,
                  calibration: Calibration) -> Level:
    """Measured runs alternating plain, n-gram, draft model for --pairs rounds, the
    calibration's rounds timed between them."""
    args.qps_scale = scale
    level = Level(scale, trace_from_args(args), SchedulerConfig(
        policy=args.policy, max_num_seqs=args.max_num_seqs, num_blocks=args.num_blocks,
        block_size=args.block_size))
    specs = _specs(args)
    level.spec = {m: [] for m in specs}
    for _ in range(args.pairs):
        level.plain.append(measured(level.trace, level.config, loaded, args.seed))
        for m, spec in specs.items():
            level.spec[m].append(measured(level.trace, replace(level.config, speculative=spec),
                                          loaded, args.seed))
        calibration.pair_done()
    return level


def simulate_level(args: argparse.Namespace, loaded: LoadedModel, cost: CalibratedCostModel,
                   level: Level, workdir: Path) -> None:
    """One more measured run of each kind, its steps priced as they run (not in the
    speedups); then the simulation of each method from its first speculative run's record."""
    trace, config, specs = level.trace, level.config, _specs(args)
    level.steps_priced["plain"] = measured(trace, config, loaded, args.seed, cost)[
        "steps_priced_over_measured"]
    for m, spec in specs.items():
        level.steps_priced[m] = measured(
            trace, replace(config, speculative=spec), loaded, args.seed,
            speculative_pricing(spec, cost)[0])["steps_priced_over_measured"]
    for m in specs:
        level.simulated[m] = simulated(trace, config, level.spec[m][0], m, cost, workdir,
                                       args.pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(parser)
    parser.set_defaults(max_requests=60, max_prompt_len=200,
                        max_output_len=64, model="tiny", threads=1)
    parser.add_argument("--qps-scales", default="8,128,1024", help="three load levels")
    parser.add_argument("--pairs", type=int, default=15, help="A/B rounds per level")
    parser.add_argument("--methods", default="ngram,draft_model")
    parser.add_argument("--policy", default=DEFAULT_POLICY)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--num-blocks", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=7,
                        help="calibration rounds, spread between the pairs")
    args = parser.parse_args()
    start = time.perf_counter()
    _, loaded = trace_and_model(args)
    print(f"CPU: {cpu_model()}; model {loaded.name}, {loaded.threads} threads, "
          f"{loaded.kernels} kernels; {args.policy}, max_num_seqs {args.max_num_seqs}, "
          f"{args.num_blocks} KV blocks; {args.pairs} A/B pairs a level")
    scales = [float(q) for q in args.qps_scales.split(",")]
    calibration = Calibration(loaded, args, args.pairs * len(scales))
    levels = [measure_level(args, loaded, q, calibration) for q in scales]
    cost = calibration.fit()
    with tempfile.TemporaryDirectory() as workdir:
        for level in levels:
            simulate_level(args, loaded, cost, level, Path(workdir))
    for method in args.methods.split(","):
        report(levels, method)
    print(f"\n{time.perf_counter() - start:.0f} s wall")


if __name__ == "__main__":
    main()
