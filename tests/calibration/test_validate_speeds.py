"""validate's per-run machine speed: the grid timed during a run says how slow the machine
ran then, window by window, and that run is simulated at those speeds."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.fit import fit_profile
from calibration.validation import RunSpeed, compare
from executor.profile import relative_speeds, window_speeds
from sim.calibrated import FEATURES, CalibratedCostModel, speed_at
from sim.core import BatchPlan, Request
from sim.engine import Engine
from sim.plan import add_to_plan
from sim.scheduler import Scheduler, SchedulerConfig
from sim.simulation import run_trace
from sim.workload import requests_from_trace
from workloads import open_trace

TRACE = "synthetic:n=40,rate=40,prompt=uniform(8,60),output=uniform(2,30)"


def _model(**kwargs) -> CalibratedCostModel:
    coefficients = dict.fromkeys(FEATURES, 0.0)
    coefficients.update(constant=2e-3, tokens=4e-5, decode_kv=1e-7)
    return CalibratedCostModel(tuple(coefficients[f] for f in FEATURES), **kwargs)


def test_relative_speeds_name_how_slow_each_tag_ran():
    base = np.array([1.0, 4.0, 9.0])  # three shapes
    # Two rounds under "a" at the usual speed, then a round split between "a" and a run
    # "b" 1.5x as slow, then one round all "b".
    times = np.array([base, base, base * [1.0, 1.5, 1.5], base * 1.5])
    tags = [["a"] * 3, ["a"] * 3, ["a", "b", "b"], ["b"] * 3]
    speeds = relative_speeds(times, tags)
    assert set(speeds) == {"a", "b"}
    assert speeds["b"] / speeds["a"] == pytest.approx(1.5)


def test_jitter_is_the_spread_left_once_the_runs_speeds_are_divided_out():
    rng = np.random.default_rng(0)
    base = rng.uniform(1e-3, 1e-2, 40)
    slowness = np.ones((4, 40))  # every round half in a fast run, half in a slow one
    slowness[::2, 20:] = slowness[1::2, :20] = 1.4
    times = base * slowness * rng.uniform(0.99, 1.01, (4, 40))
    plans = [_plan(i) for i in range(40)]
    raw = fit_profile(plans, times).model.jitter
    steady = fit_profile(plans, times, slowness).model.jitter
    assert raw[-1] / raw[0] > 1.3  # the runs' speeds read as step-to-step noise
    assert steady[-1] / steady[0] < 1.03


def _plan(i: int) -> BatchPlan:
    plan = BatchPlan()
    add_to_plan(plan, Request(f"r{i}", 0.0, 8 + 8 * i, 1), 8 + 8 * i)
    return plan


def test_scaled_model_prices_every_step_by_the_factor():
    model = _model()
    plan = _plan(3)
    assert model.scaled(1.5).predict(plan) == pytest.approx(1.5 * model.predict(plan))
    with pytest.raises(ValueError, match="factor"):
        model.scaled(0.0)


def test_each_run_is_simulated_at_the_speed_the_machine_ran_it():
    trace = open_trace(TRACE, None, 0)
    configs = {"continuous": SchedulerConfig(num_blocks=400, max_model_len=2048)}
    model = _model()
    # "Measured" runs: the same model on a machine at 1.0x, 1.6x and 1.1x the usual time.
    factors = [1.0, 1.6, 1.1]
    measured = {"continuous": [
        run_trace(requests_from_trace(trace),
                  Engine(Scheduler(configs["continuous"]), model.scaled(f)))
        for f in factors]}
    speeds = {"continuous": [RunSpeed.steady(f) for f in factors]}
    exact, _ = compare(trace, configs, measured, model, speeds=speeds)
    errors = exact["continuous"]["error"]
    assert all(abs(e) < 1e-9 for e in errors.values() if e is not None)
    assert exact["continuous"]["speeds"] == factors
    blind, _ = compare(trace, configs, measured, model)  # at the usual speed throughout
    assert blind["continuous"]["error"]["median_e2el_ms"] < -0.05


def test_window_speeds_are_a_windows_median_or_its_runs_when_it_has_few_timings():
    base = np.array([1.0, 2.0, 3.0, 4.0])
    # Round 0 at home (None); round 1 in run ("a", 0): its first window at the usual speed,
    # its second 1.5x as slow; round 2 in the same run's second window, then one timing
    # alone in a third window at 3x.
    times = np.array([base, base * [1.0, 1.0, 1.5, 1.5], base * [1.5, 1.5, 1.5, 3.0]])
    tags = [[None] * 4, [("a", 0, 0.0)] * 2 + [("a", 0, 5.0)] * 2,
            [("a", 0, 5.0)] * 3 + [("a", 0, 10.0)]]
    speeds = window_speeds(times, tags, min_timings=2)
    ratios = times / np.median(times, axis=0)
    assert speeds[None] == pytest.approx(np.median(ratios[0]))
    assert speeds[("a", 0, 0.0)] == pytest.approx(np.median(ratios[1, :2]))
    assert speeds[("a", 0, 5.0)] == pytest.approx(np.median([*ratios[1, 2:], *ratios[2, :3]]))
    assert speeds[("a", 0, 10.0)] == pytest.approx(np.median([*ratios[1], *ratios[2]]))


def test_a_drifting_model_prices_each_step_at_the_speed_when_it_was_scheduled():
    model = _model()
    drift = ((0.0, 1.0), (2.0, 1.5), (4.0, 0.8))
    plan = _plan(3)
    for t, factor in ((0.0, 1.0), (1.99, 1.0), (2.0, 1.5), (3.0, 1.5), (9.0, 0.8)):
        plan.scheduled_s = t
        assert speed_at(drift, t) == factor
        assert model.drifting(drift).execute(plan).duration_s == pytest.approx(
            factor * model.predict(plan))
    assert speed_at((), 5.0) == 1.0 and speed_at(((1.0, 2.0),), 0.0) == 2.0
    for bad in (((0.0, 1.0), (0.0, 1.2)), ((0.0, 1.0), (1.0, 0.0)), ((2.0, 1.0), (1.0, 1.0))):
        with pytest.raises(ValueError, match="drift"):
            model.drifting(bad)


def test_a_run_whose_machine_slowed_part_way_is_simulated_window_by_window():
    trace = open_trace(TRACE, None, 0)
    configs = {"continuous": SchedulerConfig(num_blocks=400, max_model_len=2048)}
    model = _model()
    # "Measured" runs on a machine that slowed 1.8x part way through each, at another time.
    drifts = [((0.0, 1.0), (0.4, 1.8)), ((0.0, 1.2), (0.6, 1.0))]
    measured = {"continuous": [
        run_trace(requests_from_trace(trace),
                  Engine(Scheduler(configs["continuous"]), model.drifting(d)))
        for d in drifts]}
    overall = [1.4, 1.1]  # what one speed per run would say
    speeds = {"continuous": [RunSpeed(o, d) for o, d in zip(overall, drifts, strict=True)]}
    exact, _ = compare(trace, configs, measured, model, speeds=speeds)
    errors = exact["continuous"]["error"]
    assert all(abs(e) < 1e-9 for e in errors.values() if e is not None)
    assert exact["continuous"]["speed_windows"] == [[list(w) for w in d] for d in drifts]
    steady = {"continuous": [RunSpeed.steady(o) for o in overall]}
    blind, _ = compare(trace, configs, measured, model, speeds=steady)
    assert max(abs(e) for e in blind["continuous"]["error"].values() if e) > 0.05
