"""Runs stopped once their SLO verdict is certain reach the verdict full runs reach."""

from __future__ import annotations

import gc

import pytest

from servelab.sweeps.grid import CapacitySlo, SweepContext, SweepPoint, find_capacity, run_point
from servelab.sweeps.runners import LocalRunner
from sim.cluster.config import ClusterConfig
from sim.cost.roofline import AnalyticCostModel
from sim.engine.core import Request
from sim.engine.scheduler import Scheduler
from workloads import load_bundled
from workloads.transforms import head

BACKEND = AnalyticCostModel.preset()
SLO = CapacitySlo(ttft_p99_ms=1500.0, itl_p99_ms=120.0)
DEPLOYMENTS = {
    "one engine": None,
    "two replicas": ClusterConfig(num_replicas=2),
    "P/D 1:1": ClusterConfig(num_prefill=1, num_decode=1, kv_bytes_per_token=131072),
}


@pytest.fixture(scope="module")
def trace():
    return head(load_bundled("azure-conv"), 300)


@pytest.mark.parametrize("name", list(DEPLOYMENTS))
def test_every_point_of_a_grid_gets_the_same_verdict_stopped_early(trace, name):
    context = SweepContext(trace, BACKEND, num_blocks=2000, cluster=DEPLOYMENTS[name])
    verdicts, stopped = [], 0
    for policy in ("chunked", "static", "continuous"):
        for scale in (1.0, 2.0, 4.0, 8.0, 16.0, 32.0):
            full = run_point(context, SweepPoint(policy, scale))
            early = run_point(context, SweepPoint(policy, scale, verdict=SLO))
            assert SLO.met(early) == SLO.met(full), (policy, scale)
            verdicts.append(SLO.met(full))
            if early["stopped_s"] is not None:
                stopped += 1
                assert not SLO.met(full)
                assert early["failed"] > 0  # what had not finished when it stopped
            else:  # a run that is not stopped is the full run, to the bit
                assert {k: early[k] for k in full} == full
    assert any(verdicts) and not all(verdicts)  # the grid crosses the SLO
    assert stopped > 0


@pytest.mark.parametrize("name", list(DEPLOYMENTS))
def test_a_stopped_run_is_freed_by_reference_counting(trace, name):
    """Most runs of a search stop with their queues full: what one built (its engines, the
    requests in flight) must be gone when it returns, not left in cycles that every pass
    of the cyclic collector scans until one frees them. (The environment itself, with the
    few events still queued, may wait for the collector.)"""
    def built() -> int:
        return sum(type(o) in (Scheduler, Request) for o in gc.get_objects())

    context = SweepContext(trace, BACKEND, num_blocks=2000, cluster=DEPLOYMENTS[name])
    gc.collect()
    gc.disable()
    try:
        before = built()
        row = run_point(context, SweepPoint("static", 32.0, verdict=SLO))
        after = built()
    finally:
        gc.enable()
    assert row["stopped_s"] is not None
    assert after == before


def test_capacity_is_the_same_with_and_without_early_stops(trace):
    context = SweepContext(trace, BACKEND, num_blocks=2000)
    configs = [SweepPoint("chunked", 1.0), SweepPoint("static", 1.0)]
    with LocalRunner(context, workers=1) as runner:
        early = find_capacity(runner, configs, SLO, 0.5, 32.0)
        full = find_capacity(runner, configs, SLO, 0.5, 32.0, stop_early=False)
    assert [c.qps_scale for c in early] == [c.qps_scale for c in full]
    assert [c.rate_rps for c in early] == [c.rate_rps for c in full]
    assert any(p["stopped_s"] is not None for c in early for p in c.probes)
    assert all(c.point.verdict is None for c in early)


def test_capacity_reuses_rows_already_run_at_a_probed_rate(trace):
    context = SweepContext(trace, BACKEND, num_blocks=2000)
    config = SweepPoint("chunked", 1.0)
    seen: list[SweepPoint] = []

    def runner(points):
        seen.extend(points)
        return [run_point(context, p) for p in points]

    plain = find_capacity(runner, [config], SLO, 0.5, 32.0)
    probed = len(seen)
    at_4 = run_point(context, SweepPoint("chunked", 4.0))  # sqrt(0.5 * 32): the first midpoint
    seen.clear()
    reused = find_capacity(runner, [config], SLO, 0.5, 32.0, known=[[at_4]])
    assert reused[0].qps_scale == plain[0].qps_scale
    assert len(seen) == probed - 1 and 4.0 not in {p.qps_scale for p in seen}
    assert any(p is at_4 for p in reused[0].probes)


def test_the_counts_a_watch_stops_at_are_exactly_where_p99_is_certainly_over():
    from sim.replay.verdict import _needed, p99_certainly_over

    for total in (0, 1, 2, 99, 100, 101, 250, 19366):
        needed = _needed(total)
        if total == 0:
            assert needed == float("inf")
            continue
        assert p99_certainly_over(needed, total) and not p99_certainly_over(needed - 1, total)
