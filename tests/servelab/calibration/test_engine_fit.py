"""Fitting vLLM's own time: the fit recovers known terms from synthetic runs and keeps every
term in its physical bounds."""

from __future__ import annotations

import pytest

from servelab.calibration.engine_fit import (
    all_bounds,
    fit,
    fit_host,
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


TRUE = {"step_s": 1.2e-3, "per_row_s": 8e-6, "piecewise_layer_s": 50e-6, "request_s": 6e-3}
BOUNDS = {"step_s": (0.0, 5e-3), "per_row_s": (0.0, 1e-4), "piecewise_layer_s": (0.0, 200e-6),
          "request_s": (0.0, 0.02)}


def _synthetic(true: dict[str, float]):
    """A price function exact at the true terms: each run's TTFT misses the request time and
    40 layers of piecewise launches, its TPOT half those launches and, where its vLLM runs
    the host in series (0.12), the host step and its rows' output processing."""
    def price(engine: EngineOverhead) -> list[list[Sample]]:
        sets = []
        for offset, version in ((0, "0.12.0"), (100, "0.19.0")):
            done = []
            for i in range(6):
                rows, measured, measured_tpot = 1 + 7 * i, 30.0 + offset + 20 * i, 10.0 + i
                launch_ms = 40 * (true["piecewise_layer_s"] - engine.piecewise_layer_s) * 1e3
                host_ms = (true["step_s"] - engine.step_s
                           + (true["per_row_s"] - engine.per_row_s) * rows) * 1e3
                ttft = measured - (true["request_s"] - engine.request_s) * 1e3 - launch_ms
                tpot = measured_tpot - launch_ms / 2 - (host_ms if version < "0.14" else 0.0)
                done.append(Sample(f"s{offset}-{i}", (offset,), measured, measured_tpot, ttft,
                                   tpot, version, rows))
            sets.append(done)
        return sets
    return price


def test_the_fit_recovers_known_terms_from_synthetic_runs():
    result = fit(_synthetic(TRUE), BASE, BOUNDS)
    for term, value in TRUE.items():
        assert getattr(result, term) == pytest.approx(value, rel=1e-6, abs=1e-12), term
    assert result.objective == pytest.approx(0.0, abs=1e-9)
    assert result.engine(BASE).request_s == pytest.approx(TRUE["request_s"])


def test_the_fit_keeps_terms_in_bounds_when_the_truth_lies_outside():
    wild = {"step_s": 9e-3, "per_row_s": 5e-4, "piecewise_layer_s": 400e-6, "request_s": 0.05}
    result = fit(_synthetic(wild), BASE, BOUNDS)
    for term, (lo, hi) in BOUNDS.items():
        assert lo <= getattr(result, term) <= hi, term
    assert result.piecewise_layer_s == 200e-6  # the nearest the data can get


def test_without_serial_runs_the_host_terms_stay_as_given():
    assert fit_host([_sample(0, 10.0, 10.0)], (0.0, 5e-3), (0.0, 1e-4)) is None


def test_the_host_fit_leaves_out_runs_whose_gpu_steps_alone_are_twice_too_slow():
    """Serial runs whose missing TPOT is exactly 1.2 ms + 8 us a row, and two whose replay
    alone takes 80 times their measured TPOT (another batch than measured): the fit keeps
    the first."""
    done = [Sample(f"s{i}", ("m", 1, "bf16"), 50.0, 20.0 + i, 50.0,
                   20.0 + i - (1.2 + 0.008 * rows), "0.12.0", rows)
            for i, rows in enumerate((1, 4, 8, 16, 32, 64, 128))]
    done += [Sample(f"bad{i}", ("m", 1, "bf16"), 50.0, 5.0, 50.0, 400.0, "0.11.2", 512)
             for i in range(2)]
    step_s, per_row_s = fit_host(done, (0.0, 5e-3), (0.0, 1e-4))
    assert step_s == pytest.approx(1.2e-3, rel=1e-6)
    assert per_row_s == pytest.approx(8e-6, rel=1e-6)


def test_the_shipped_bounds_are_the_physical_ones():
    bounds = all_bounds()
    assert bounds["request_s"] == (0.0, 0.02) and bounds["step_s"] == (0.0, 0.005)
    engine = load_vllm()
    for term, (lo, hi) in bounds.items():
        assert lo <= getattr(engine, term) <= hi, term


def test_the_objective_weighs_each_data_set_alike():
    exact = [_sample(0, 10.0, 10.0)]
    off = [_sample(i, 10.0, 12.0) for i in range(50)]
    assert objective([exact, off]) == pytest.approx((0.0 + 0.1) / 2)


def test_the_fit_reports_every_grid_point_and_keeps_the_best():
    seen = []
    result = fit(_synthetic(TRUE), BASE, BOUNDS, progress=seen.append)
    assert [p.piecewise_layer_s for p in seen] == pytest.approx([0, 50e-6, 100e-6, 150e-6, 200e-6])
    assert result.objective == min(p.objective for p in seen)
