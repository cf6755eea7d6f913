"""Does profiling a shape price the steps a run takes? In-run steps vs the same shapes
profiled, side by side in one measured run.

Every --every-th step of a measured run is, right after it ran, (a) executed again as the
same plan (the run's own step-to-step noise) and (b) rebuilt as a ProfilePoint and timed
the way `servelab calibrate` times grid shapes (fresh requests and KV blocks, one untimed
run, one timed); they take turns going first. Because the three times are taken
milliseconds apart, drift of a shared machine cancels out of the ratios, which a
calibration-then-validation comparison minutes apart cannot promise.

    python benchmarks/fidelity/profile_vs_run.py --trace azure-conv --max-requests 150 \\
        --length-scale 0.1 --qps-scale 3

prints, per step kind (executor.calibration.validation.STEP_KINDS), the median in-run step and the
medians of
again / in-run and profiled / in-run. --separate also profiles on a second backend with its
own KV pool, where validate --calibrate times a grid shape that does not fit the run's free
KV blocks; --grid interleaves the grid as validate does (on the run's backend where a shape
fits, else on the second) and adds each time over its fit's prediction. The run is slower
than a plain one (every checked step runs three or more times again), so its latencies mean
nothing; only the step ratios do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from run_args import add_run_args, trace_and_model  # noqa: E402

from executor.backend import ModelBackend  # noqa: E402
from executor.calibration.fit import fit_profile  # noqa: E402
from executor.calibration.interleave import Interleaved  # noqa: E402
from executor.calibration.validation import STEP_KINDS, step_kind  # noqa: E402
from executor.profile import (  # noqa: E402
    GridProfile,
    ProfilePoint,
    point_prompts,
    profile_grid,
    run_point,
)
from executor.prompts import attach_prompt_tokens  # noqa: E402
from sim.engine.block_manager import BlockManager  # noqa: E402
from sim.engine.core import BatchPlan, StepResult, row_knots  # noqa: E402
from sim.engine.scheduler import Scheduler  # noqa: E402
from sim.engine.scheduler_config import (  # noqa: E402
    DEFAULT_POLICY,  # noqa: E402
    POLICIES,
    SchedulerConfig,
)
from sim.engine.step import Engine  # noqa: E402
from sim.replay.simulation import run_trace  # noqa: E402
from sim.replay.workload import requests_from_trace  # noqa: E402


class CheckingBackend(ModelBackend):
    """A ModelBackend that times every `every`-th step twice more: again as the same plan,
    and profiled as the same shape."""

    def __init__(self, *args, every: int, seed: int, separate: ModelBackend | None = None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.every, self.steps = every, 0
        self.separate = separate
        self.rng = np.random.default_rng(seed)
        # kind, plan, run, again, profiled (and profiled on the separate backend, if one)
        self.checked: list[tuple] = []
        self.skipped = 0  # steps whose shape did not fit the KV blocks left free
        self.checking = False

    def execute(self, plan: BatchPlan) -> StepResult:
        result = super().execute(plan)
        if self.checking:  # a profiled step of a check: run_point calls back in here
            return result
        self.steps += 1
        if self.steps % self.every == 0 and (plan.requests or plan.padding):
            point = ProfilePoint.from_plan(plan)
            if point.blocks(self.block_manager) > self.block_manager.num_free_blocks:
                self.skipped += 1
                return result
            prompts = point_prompts(point, self.model.args.vocab_size, self.rng)
            timings = {"again": lambda: super(CheckingBackend, self).execute(plan).duration_s,
                       "profiled": lambda: self._profiled(point, prompts, self)}
            if self.separate is not None:
                timings["separate"] = lambda: self._profiled(point, prompts, self.separate)
            order = list(timings)
            k = len(self.checked) % len(order)  # rotate which one runs first
            times = {name: timings[name]() for name in order[k:] + order[:k]}
            self.checked.append((step_kind(plan), plan, result.duration_s,
                                 *(times[name] for name in timings)))
        return result

    def _profiled(self, point: ProfilePoint, prompts: list[list[int]],
                  backend: ModelBackend) -> float:
        self.checking = True
        try:
            run_point(point, backend, prompts)  # untimed, as the profile warms small shapes
            return run_point(point, backend, prompts)[1]
        finally:
            self.checking = False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_args(parser)
    parser.add_argument("--policy", choices=POLICIES, default=DEFAULT_POLICY)
    parser.add_argument("--every", type=int, default=1, help="check every N-th step")
    parser.add_argument("--separate", action="store_true",
                        help="also profile on a separate backend with its own KV pool, "
                             "where validate --calibrate times shapes the run's pool can't hold")
    parser.add_argument("--grid", action="store_true",
                        help="and time the profile grid between the run's steps as validate "
                             "--calibrate does; ratios to its fit too")
    args = parser.parse_args(argv)
    if args.every < 1:
        parser.error(f"--every must be >= 1, got {args.every}")
    trace, loaded = trace_and_model(args)
    num_blocks = loaded.kv_blocks(args.block_size, args.kv_cache_gib)
    config = SchedulerConfig(policy=args.policy, num_blocks=num_blocks,
                             block_size=args.block_size, max_model_len=loaded.max_model_len(None))
    requests = requests_from_trace(trace)
    attach_prompt_tokens(requests, loaded.vocab_size, args.seed)
    scheduler = Scheduler(config)
    separate = None
    if args.separate or args.grid:
        separate = ModelBackend(loaded.model, BlockManager(num_blocks, args.block_size))
    backend = CheckingBackend(loaded.model, scheduler.block_manager, every=args.every,
                              seed=args.seed, separate=separate)
    fit = None
    if args.grid:
        fit = _run_with_grid(requests, scheduler, backend, separate, args.seed)
    else:
        run_trace(requests, Engine(scheduler, backend))
    print(f"{args.policy}, {len(requests)} requests, {loaded.name} on {loaded.device}: "
          f"{len(backend.checked)} steps checked, {backend.skipped} skipped (KV pool full)")
    _print_ratios(backend.checked, separate is not None, fit)
    return 0


def _run_with_grid(requests: list, scheduler: Scheduler, backend: CheckingBackend,
                   separate: ModelBackend, seed: int):
    """The run with the grid interleaved as validate does (on the run's backend where a
    shape fits, else on `separate`); the grid's fit."""
    config = scheduler.config
    profile = GridProfile(separate, profile_grid(config.max_model_len,
                                                 config.num_blocks * config.block_size), seed)
    profile.run_round(timed=False)
    mixed = Interleaved(profile)
    mixed.use_backend(backend)

    def on_step(now: float, done: list) -> None:
        backend.checking = True  # the grid's shapes are not the run's steps to check
        try:
            mixed.on_step(now, done)
        finally:
            backend.checking = False

    run_trace(requests, Engine(scheduler, backend), on_step=on_step)
    profile.use(None)  # the run is over: the rest of the grid at home, as validate does
    profile.finish()
    fit = fit_profile(profile.plans, profile.times, row_knots=row_knots(separate))
    print(f"grid: {len(profile.rounds)} rounds interleaved, {profile.borrowed} of "
          f"{profile.times.size} timings on the run's backend; {fit.describe()}")
    return fit


def _print_ratios(checked: list[tuple], separate: bool, fit) -> None:
    """Per step kind: the median in-run step, and the medians of each time over it (and over
    the fit's prediction, with --grid)."""
    names = ["again", "profiled"] + (["separate"] if separate else [])
    columns = [f"{n}/run" for n in names] + (["separate/profiled"] if separate else [])
    if fit is not None:
        columns += [f"{n}/fit" for n in ["run"] + names[1:]]
    print(f"{'step kind':24s} {'steps':>6s} {'in-run ms':>10s}"
          + "".join(f" {c:>{max(10, len(c))}s}" for c in columns))
    for kind in (*STEP_KINDS, "all"):
        rows = [r for r in checked if kind in ("all", r[0])]
        if not rows:
            continue
        times = np.array([r[2:] for r in rows], dtype=float).T
        run, timed = times[0], dict(zip(names, times[1:], strict=True))
        ratios = [timed[n] / run for n in names]
        if separate:
            ratios.append(timed["separate"] / timed["profiled"])
        if fit is not None:
            predicted = np.array([fit.model.predict(r[1]) for r in rows])
            ratios += [t / predicted for t in [run] + [timed[n] for n in names[1:]]]
        print(f"{kind:24s} {len(rows):6d} {np.median(run) * 1e3:10.2f}" + "".join(
            f" {np.median(x):>{max(10, len(c))}.3f}" for x, c in zip(ratios, columns,
                                                                      strict=True)))


if __name__ == "__main__":
    raise SystemExit(main())
