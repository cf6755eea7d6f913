"""Validation's own machinery: medians over measured runs, and the grid interleaved with them."""

from __future__ import annotations

import pytest

import executor.calibration.interleave as interleave
from executor.calibration.validation import STEP_KINDS, in_run_step_error, median_summary
from sim.cost.calibrated import FEATURES, CalibratedCostModel
from sim.engine.core import BatchPlan, Request


def test_validate_measured_summary_is_the_median_of_its_runs():
    runs = [{"output_throughput": v, "median_ttft_ms": None, "completed": 5} for v in (90, 110)]
    merged, spread = median_summary(runs)
    assert merged["output_throughput"] == 100 and merged["completed"] == 5
    assert spread["output_throughput"] == 0.2 and spread["median_ttft_ms"] is None


def test_interleaved_grid_keeps_its_share_of_the_runs_time(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(interleave.time, "perf_counter", lambda: clock[0])

    class Grid:  # each shape takes 0.3 s
        shapes = 0

        def run_next(self):
            self.shapes += 1
            clock[0] += 0.3

    grid, seen = Grid(), []
    mixed = interleave.Interleaved(grid, share=1.0, on_step=lambda now, done: seen.append(now))
    mixed.start_run("continuous", 0)
    assert grid.tag == ("continuous", 0)  # the grid's timings name the run they fell in
    for i in range(10):  # ten steps of 0.1 s: 1 s of run, so about 1 s of grid
        clock[0] += 0.1
        mixed.on_step(i * 0.1, [])
        assert grid.tag == ("continuous", 0)
        assert mixed.grid_s >= mixed.run_s
    assert grid.shapes == 4 and len(seen) == 10
    clock[0] += 50.0  # between runs (simulating, saving): not the runs' time
    mixed.start_run()
    clock[0] += 0.1
    mixed.on_step(0.0, [])
    assert grid.tag is None  # between runs
    assert mixed.run_s == pytest.approx(1.1) and grid.shapes == 4


def _decode_plan(request_id: str, computed: int) -> BatchPlan:
    request = Request(request_id, 0.0, computed, 4)
    request.num_computed_tokens = computed
    return BatchPlan(requests=[request], decode_seqs=1, num_sampled=1,
                     decode_context=computed + 1, decode_context_max=computed + 1)


def test_in_run_step_error_groups_steps_by_kind():
    model = CalibratedCostModel((0.002, 0.001, 1e-4) + (0.0,) * (len(FEATURES) - 3))
    small = _decode_plan("a", 40)
    large = BatchPlan(requests=[Request(f"b{i}", 0.0, 9, 4) for i in range(20)],
                      decode_seqs=20, num_sampled=20)
    prefill = BatchPlan(requests=[Request("c", 0.0, 64, 4)], prefill_tokens=64,
                        prefill_seqs=1, num_sampled=1)
    padded = BatchPlan(requests=[Request("d", 0.0, 9, 4)], padding=[Request("e", 0.0, 9, 4)],
                       decode_seqs=2, num_sampled=1)
    steps = [(small, 0.9 * model.predict(small)), (small, 1.1 * model.predict(small)),
             (small, 0.8 * model.predict(small)), (large, 1.2 * model.predict(large)),
             (prefill, model.predict(prefill)), (padded, 0.5 * model.predict(padded)),
             (BatchPlan(), 0.001)]  # an empty plan predicts nothing and is left out
    error = in_run_step_error(model, steps)
    assert list(error) == list(STEP_KINDS)
    assert error["decode, 1-13 rows"]["steps"] == 3
    assert error["decode, 1-13 rows"]["median_ratio"] == pytest.approx(0.9)
    assert error["decode, 1-13 rows"]["time_ratio"] == pytest.approx(2.8 / 3)  # same shape
    assert error["decode, 14+ rows"]["median_ratio"] == pytest.approx(1.2)
    assert error["with a prefill chunk"]["median_ratio"] == pytest.approx(1.0)
    assert error["static, with padding"]["median_ratio"] == pytest.approx(0.5)
    assert sum(e["time_share"] for e in error.values()) == pytest.approx(1.0)
    assert in_run_step_error(model, []) == {}
