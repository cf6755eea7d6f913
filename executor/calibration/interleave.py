"""The profile grid timed between a measured run's steps: a calibration that samples the
machine at the moments the runs do, and how slow the machine ran during each run."""

from __future__ import annotations

import time

from executor.calibration.fit import Fit, fit_profile
from executor.calibration.validation import measure_runs
from sim.engine.scheduler_config import SchedulerConfig
from sim.replay.simulation import RunResult
from workloads.trace import Trace

# validate --calibrate keeps the profile grid's time near this share of the measured runs'.
GRID_SHARE = 1.0


class Interleaved:
    """Times the profile grid (an executor.profile.GridProfile) a shape at a time between a
    measured run's steps, keeping the grid's time near `share` x the runs' time, so the
    calibration samples the machine at the moments the runs do (a shared machine's speed
    drifts over minutes; timed inside a run, a shape costs what the run's own step of that
    shape does: benchmarks/fidelity/profile_vs_run.py), on the run's own backend where the
    shape fits in its free KV blocks (`use_backend`). A run's clock advances by its own steps
    alone (measured_run), so the shapes in between change none of its metrics."""

    def __init__(self, profile, share: float = GRID_SHARE, on_step=None) -> None:
        self.profile, self.share, self.then = profile, share, on_step
        self.run_s = self.grid_s = 0.0
        self._mark = time.perf_counter()

    def start_run(self, *run) -> None:
        """Call before each run, naming it (the grid's timings are tagged with it until the
        next): the time since the last step was not the runs'."""
        self.profile.tag = run or None
        self._mark = time.perf_counter()

    def use_backend(self, backend) -> None:
        """Time shapes on the run's backend (measure_runs' on_backend): the run's own KV
        pool and buffers, where a second pool's would cost a few percent more
        (profile_vs_run.py --separate)."""
        self.profile.use(backend)

    def on_step(self, now: float, done: list) -> None:
        """After each run step (ending at `now` on the run's clock): time grid shapes until
        the grid has its share again."""
        if self.then is not None:
            self.then(now, done)
        self.run_s += time.perf_counter() - self._mark
        while self.grid_s < self.share * self.run_s:
            start = time.perf_counter()
            self.profile.run_next()
            self.grid_s += time.perf_counter() - start
        self._mark = time.perf_counter()


def measure_interleaved(trace: Trace, configs: dict[str, SchedulerConfig], model, profile,
                        seed: int = 0, on_step=None, on_run=None, repeats: int = 1,
                        step_logs: dict[str, list] | None = None, open_loop: bool = False
                        ) -> tuple[dict[str, list[RunResult]], dict[str, list[float]],
                                   list[list[float]]]:
    """measure_runs with the profile grid (an executor.profile.GridProfile) timed in the same
    sitting: a warm-up round, then shapes between the runs' steps (Interleaved), the last
    round completed after them (two rounds at least, for the step jitter). Returns the runs;
    per policy how slow the machine ran the grid's shapes during each run (relative_speeds;
    1 for a run too short to time one); and the slowness in force at each of the grid's
    timings ([rounds, shapes]). on_run: after each warm-up shape; open_loop: as in
    measure_runs."""
    from executor.profile import relative_speeds

    profile.run_round(timed=False, on_run=on_run)
    mixed = Interleaved(profile, on_step=on_step)
    measured = measure_runs(trace, configs, model, seed, mixed.on_step, repeats,
                            mixed.start_run, step_logs, mixed.use_backend, open_loop)
    profile.tag = None  # after the runs, at home
    profile.use(None)
    profile.finish()
    tags = profile.round_tags
    by_run = relative_speeds(profile.times, tags)
    slowness = [[by_run[tag] for tag in row] for row in tags]
    speeds = {policy: [by_run.get((policy, k), 1.0) for k in range(len(runs))]
              for policy, runs in measured.items()}
    return measured, speeds, slowness


def measure_and_calibrate(trace: Trace, configs: dict[str, SchedulerConfig], model, profile,
                          seed: int = 0, on_step=None, on_run=None, repeats: int = 1,
                          step_logs: dict[str, list] | None = None, open_loop: bool = False
                          ) -> tuple[dict[str, list[RunResult]], Fit, dict[str, list[float]]]:
    """measure_interleaved, and the cost model fitted to the grid's rounds: the runs, the
    fit and each run's speed."""

    measured, speeds, slowness = measure_interleaved(trace, configs, model, profile, seed,
                                                     on_step, on_run, repeats, step_logs,
                                                     open_loop)
    fit = fit_profile(profile.plans, profile.times, slowness, profile.home.row_knots)
    return measured, fit, speeds
