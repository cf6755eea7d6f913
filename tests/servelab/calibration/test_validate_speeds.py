"""validate's per-run machine speed: the grid timed during a run says how slow the machine
ran then, and that run is simulated at that speed."""

from __future__ import annotations

import numpy as np
import pytest

from executor.calibration.fit import fit_profile
from executor.calibration.validation import compare
from executor.profile import relative_speeds
from sim.cost.calibrated import FEATURES, CalibratedCostModel
from sim.engine.batch_plan import add_to_plan
from sim.engine.core import BatchPlan, Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace
from sim.replay.workload import requests_from_trace
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
    speeds = {"continuous": factors}
    exact, _ = compare(trace, configs, measured, model, speeds=speeds)
    errors = exact["continuous"]["error"]
    assert all(abs(e) < 1e-9 for e in errors.values() if e is not None)
    assert exact["continuous"]["speeds"] == factors
    blind, _ = compare(trace, configs, measured, model)  # at the usual speed throughout
    assert blind["continuous"]["error"]["median_e2el_ms"] < -0.05
