"""Fitting vLLM's own time: the fit recovers known terms from synthetic runs and keeps every
term in its physical bounds."""

from __future__ import annotations

import pytest

from servelab.calibration.engine_fit import (
    bounds,
    fit,
    fit_request_s,
    objective,
    weighted_median,
)
from servelab.calibration.engine_runs import Sample
from sim.cost.engine_overhead import EngineOverhead, load_vllm

BASE = EngineOverhead("vllm", 1e-3, 0.0, 1e-5, "", overlapped=True, graph_max_rows=512)


def _sample(i: int, measured_ttft_ms: float, ttft_ms: float, tpot_ms: float = 10.0) -> Sample:
    return Sample(f"s{i}", ("m", 1, "bf16"), measured_ttft_ms, 10.0, ttft_ms, tpot_ms)


def test_weighted_median_minimises_the_weighted_absolute_deviation():
    assert weighted_median([1.0, 2.0, 3.0], [1.0, 1.0, 1.0]) == 2.0
    assert weighted_median([1.0, 2.0, 3.0], [1.0, 1.0, 5.0]) == 3.0
    with pytest.raises(ValueError, match="no values"):
        weighted_median([], [])


def test_the_request_time_of_synthetic_runs_is_recovered():
    # Every run's prediction misses exactly 7 ms of front end.
    done = [_sample(i, 40.0 + 30 * i, 33.0 + 30 * i) for i in range(9)]
    assert fit_request_s(done, 0.0, 0.02) == pytest.approx(7e-3)
    # Priced with 3 ms already in: the fit still says 7.
    shifted = [_sample(i, s.measured_ttft_ms, s.ttft_ms + 3.0) for i, s in enumerate(done)]
    assert fit_request_s(shifted, 0.0, 0.02, request_s=3e-3) == pytest.approx(7e-3)


def test_the_request_time_stays_in_its_bounds():
    slow = [_sample(i, 50.0, 100.0) for i in range(3)]  # predictions already too slow
    assert fit_request_s(slow, 0.0, 0.02) == 0.0
    fast = [_sample(i, 500.0, 100.0) for i in range(3)]  # 400 ms short: beyond the front end
    assert fit_request_s(fast, 0.0, 0.02) == 0.02


def _synthetic(true_request_s: float, true_piecewise_s: float):
    """A price function whose runs are exact at the true terms: each run's TTFT misses
    the request time and 40 layers of piecewise launches, each TPOT half those launches."""
    def price(engine: EngineOverhead) -> list[list[Sample]]:
        sets = []
        for offset in (0, 100):
            done = []
            for i in range(6):
                measured = 30.0 + offset + 20 * i
                miss_ms = 40 * (true_piecewise_s - engine.piecewise_layer_s) * 1e3
                ttft = measured - true_request_s * 1e3 - miss_ms + engine.request_s * 1e3
                tpot = 10.0 - miss_ms / 2
                done.append(Sample(f"s{offset}-{i}", (offset,), measured, 10.0, ttft, tpot))
            sets.append(done)
        return sets
    return price


def test_the_fit_recovers_known_terms_from_synthetic_runs():
    result = fit(_synthetic(6e-3, 50e-6), BASE, (0.0, 0.02), (0.0, 200e-6))
    assert result.request_s == pytest.approx(6e-3)
    assert result.piecewise_layer_s == pytest.approx(50e-6)
    assert result.objective == pytest.approx(0.0, abs=1e-12)


def test_the_fit_keeps_terms_in_bounds_when_the_truth_lies_outside():
    result = fit(_synthetic(50e-3, 400e-6), BASE, (0.0, 0.02), (0.0, 200e-6))
    assert 0.0 <= result.request_s <= 0.02
    assert 0.0 <= result.piecewise_layer_s <= 200e-6
    assert result.piecewise_layer_s == 200e-6  # the nearest the data can get


def test_the_shipped_bounds_are_the_physical_ones():
    assert bounds("request_s") == (0.0, 0.02)
    assert bounds("step_s") == (0.0, 0.005)
    engine = load_vllm()
    assert bounds("piecewise_layer_s")[0] <= engine.piecewise_layer_s
    assert engine.piecewise_layer_s <= bounds("piecewise_layer_s")[1]


def test_the_objective_weighs_each_data_set_alike():
    exact = [_sample(0, 10.0, 10.0)]
    off = [_sample(i, 10.0, 12.0) for i in range(50)]
    assert objective([exact, off]) == pytest.approx((0.0 + 0.1) / 2)
