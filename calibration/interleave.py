"""The profile grid timed between a measured run's steps: a calibration that samples the
machine at the moments the runs do, and how slow the machine ran during each run."""

from __future__ import annotations

import time

from calibration.fit import Fit, fit_profile
from calibration.validation import RunSpeed, measure_runs
from sim.scheduler import SchedulerConfig
from sim.simulation import RunResult
from workloads.trace import Trace

# validate --calibrate keeps the profile grid's time near this share of the measured runs'.
GRID_SHARE = 1.0
# The grid's timings during a run are grouped in windows of this much of the run's clock,
# each the machine's speed then, if it holds SPEED_WINDOW_MIN timings (else the run's). A
# shared machine's speed moves within a run too, by more than over whole runs (docs/fidelity.md).
SPEED_WINDOW_S = 5.0
SPEED_WINDOW_MIN = 20


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
