"""Sweeps: the grid, one point's row, runners agreeing, and the capacity bisection."""

from __future__ import annotations

import pytest

from servelab.sweeps.grid import (
    CapacitySlo,
    SweepContext,
    SweepPoint,
    find_capacity,
    grid,
    run_point,
)
from servelab.sweeps.runners import LocalRunner, RayRunner
from sim.cost.roofline import AnalyticCostModel
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.metrics import summarize
from sim.replay.simulation import run_trace
from sim.replay.workload import requests_from_trace
from workloads import load_bundled
from workloads.transforms import head, scale_qps

BACKEND = AnalyticCostModel.preset()


@pytest.fixture(scope="module")
def context() -> SweepContext:
    return SweepContext(head(load_bundled("azure-conv"), 300), BACKEND, num_blocks=3000)


def test_grid_crosses_everything_and_varies_budgets_of_chunked_only():
    points = grid(["continuous", "chunked"], [4, 1], num_blocks=[100, 200],
                  token_budgets=[512, 2048])
    assert len(points) == 2 * 2 * (1 + 2)
    assert [p.qps_scale for p in points] == sorted(p.qps_scale for p in points)
    assert {p.token_budget for p in points if p.policy == "continuous"} == {None}
    assert {p.token_budget for p in points if p.policy == "chunked"} == {512, 2048}
    with pytest.raises(ValueError, match="> 0"):
        grid(["static"], [0.0])
    with pytest.raises(ValueError, match="at least one"):
        grid([], [1.0])


def test_a_point_is_the_same_run_as_simulate(context):
    row = run_point(context, SweepPoint("recompute", 3.0, num_blocks=500))
    config = SchedulerConfig(policy="recompute", num_blocks=500)
    trace = scale_qps(context.trace, 3.0)
    direct = summarize(run_trace(requests_from_trace(trace), Engine(Scheduler(config), BACKEND)))
    assert row["preemptions"] > 0  # a pool this small makes the point interesting
    assert {k: row[k] for k in direct} == direct
    assert row["num_blocks"] == 500 and row["token_budget"] == config.budget
    assert row["rate_rps"] == pytest.approx(3.0 * len(trace) / context.trace.span_s, rel=1e-6)


def test_a_bad_combination_fails_naming_the_limit(context):
    with pytest.raises(ValueError, match="token_budget"):
        context.config(SweepPoint("chunked", 1.0, token_budget=100, max_num_seqs=256))


def test_pool_and_in_process_give_identical_rows(context):
    points = grid(["static", "chunked"], [2.0, 6.0], num_blocks=[800])
    with LocalRunner(context, workers=1) as runner:
        alone = runner(points)
    with LocalRunner(context, workers=2) as runner:
        pooled = runner(points)
    assert pooled == alone


def test_workers_must_be_positive(context):
    with pytest.raises(ValueError, match="workers must be >= 1"):
        LocalRunner(context, workers=0)


def test_ray_gives_identical_rows(context):
    pytest.importorskip("ray")
    points = grid(["continuous", "recompute"], [2.0, 8.0], num_blocks=[600])
    with LocalRunner(context, workers=1) as runner:
        local = runner(points)
    configs = [SweepPoint("chunked", 1.0)]
    slo = CapacitySlo(1500.0, 120.0)
    with LocalRunner(context, workers=2) as runner:  # points one at a time, in a pool
        pooled = find_capacity(runner, configs, slo, 0.5, 32.0)
    with RayRunner(context, "auto", workers=2) as runner:
        remote = runner(points)
        streamed = find_capacity(runner, configs, slo, 0.5, 32.0)
    assert remote == local
    assert [(c.qps_scale, c.probes) for c in streamed] == [(c.qps_scale, c.probes) for c in pooled]


def _fake_runner(knee: dict[str, float]):
    """Latency passes the SLO below each policy's knee rate and fails above it."""
    calls = []

    def runner(points):
        calls.append(len(points))
        return [{"policy": p.policy, "rate_rps": 10 * p.qps_scale, "failed": 0, "rejected": 0,
                 "p99_ttft_ms": 100.0 if p.qps_scale <= knee[p.policy] else 1e6,
                 "p99_itl_ms": 10.0} for p in points]

    return runner, calls


def test_capacity_bisects_to_the_knee_and_flags_the_range_ends():
    runner, calls = _fake_runner({"continuous": 3.0, "chunked": 5.5, "static": 0.1,
                                  "recompute": 100.0})
    configs = [SweepPoint(p, 1.0) for p in ("continuous", "chunked", "static", "recompute")]
    found = {c.point.policy: c for c in find_capacity(runner, configs, CapacitySlo(), 0.25, 16,
                                                      rel_tol=0.02)}
    for policy, knee in (("continuous", 3.0), ("chunked", 5.5)):
        assert knee / 1.02 <= found[policy].qps_scale <= knee
        assert found[policy].rate_rps == pytest.approx(10 * found[policy].qps_scale)
        assert found[policy].bounded == ""
    assert found["static"].qps_scale == 0 and found["static"].bounded == "below-range"
    assert found["recompute"].qps_scale == 16 and found["recompute"].bounded == "above-range"
    assert calls == [1] * len(calls)  # a plain runner runs one probe per call


class _ReversedStream:
    """A Stream with three slots whose latest point finishes first; it records what was in
    flight together."""

    slots = 3

    def __init__(self, knee: dict[str, float]) -> None:
        self.runner, _ = _fake_runner(knee)
        self.flights: list[list[SweepPoint]] = []
        self._handles = 0
        self._points: dict[int, SweepPoint] = {}

    def submit(self, point: SweepPoint) -> int:
        self._handles += 1
        self._points[self._handles] = point
        return self._handles

    def wait(self, handles):
        self.flights.append([self._points[h] for h in handles])
        last = max(handles)
        return [(last, self.runner([self._points.pop(last)])[0])]


def test_capacity_streamed_out_of_order_finds_the_same_knees_one_probe_in_flight_each():
    knees = {"continuous": 3.0, "chunked": 5.5, "static": 0.1, "recompute": 100.0}
    configs = [SweepPoint(p, 1.0) for p in knees]
    plain_runner, _ = _fake_runner(knees)
    plain = find_capacity(plain_runner, configs, CapacitySlo(), 0.25, 16)
    stream = _ReversedStream(knees)
    streamed = find_capacity(stream, configs, CapacitySlo(), 0.25, 16)
    assert [(c.qps_scale, c.bounded, len(c.probes)) for c in streamed] == \
        [(c.qps_scale, c.bounded, len(c.probes)) for c in plain]
    assert max(len(f) for f in stream.flights) == 3
    for flight in stream.flights:  # past its two range ends, one probe per configuration
        policies = [p.policy for p in flight if p.qps_scale not in (0.25, 16)]
        assert len(policies) == len(set(policies))


def test_capacity_slo_needs_no_request_failed():
    slo = CapacitySlo(1000, 100)
    good = {"failed": 0, "rejected": 0, "p99_ttft_ms": 900.0, "p99_itl_ms": 90.0}
    assert slo.met(good)
    assert slo.met({**good, "rejected": 1})  # too long for the model at any rate
    assert not slo.met({**good, "failed": 1})
    assert not slo.met({**good, "p99_itl_ms": 101.0})
    assert not slo.met({**good, "p99_ttft_ms": None})
    with pytest.raises(ValueError, match="> 0"):
        CapacitySlo(0, 100)


def test_capacity_skips_probes_a_known_row_decides_and_finds_the_same_knee():
    knees = {"continuous": 3.0, "chunked": 0.1, "static": 100.0}
    configs = [SweepPoint(p, 1.0) for p in knees]
    plain_runner, _ = _fake_runner(knees)
    plain = find_capacity(plain_runner, configs, CapacitySlo(), 0.25, 16)
    seen: list[SweepPoint] = []

    def runner(points):
        seen.extend(points)
        return [{**row, "qps_scale": p.qps_scale}
                for p, row in zip(points, plain_runner(points), strict=True)]

    grid_rows = {p: runner([SweepPoint(p, s) for s in (2.0, 2.5, 3.5, 5.0)]) for p in knees}
    seen.clear()
    found = find_capacity(runner, configs, CapacitySlo(), 0.25, 16,
                          known=[grid_rows[p] for p in knees], rate_of=lambda s: 10 * s)
    for fast, full in zip(found, plain, strict=True):
        assert (fast.qps_scale, fast.rate_rps, fast.bounded) == \
            (full.qps_scale, full.rate_rps, full.bounded)
        assert len(fast.probes) == len(full.probes)
    # continuous: holds at 2.5 and fails at 3.5, so only probes between them run; chunked
    # fails at 2 (all probes above it implied); static holds at 5 (all below it implied).
    assert all(p.qps_scale > 5.0 for p in seen if p.policy == "static")
    assert all(2.5 < p.qps_scale < 3.5 for p in seen if p.policy == "continuous")
    assert all(p.qps_scale < 2.0 for p in seen if p.policy == "chunked")
    assert sum(c.implied for c in found) > 0
    assert found[2].implied == 1  # static: 0.25 implied; 16 is past the grid, and holds
