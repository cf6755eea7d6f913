"""An engine that schedules one step ahead (vLLM's async scheduling): a request arriving
while a step runs misses the step already planned and joins the one after; one arriving at
an idle engine, or while the engine has nothing else to run, starts at once. Time comes
from a backend with set step durations, never from a clock."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from sim.cluster.config import ClusterConfig
from sim.cluster.router import RouterConfig
from sim.cluster.run import run_cluster
from sim.cost.fixed_backend import ConstantBackend
from sim.engine.core import Request
from sim.engine.scheduler import Scheduler, SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace

STEP_S = 0.010


@dataclass(frozen=True)
class AheadBackend(ConstantBackend):
    """Steps of STEP_S; whether the host plans the next step while this one runs."""

    schedules_ahead: bool = True


def _engine(ahead: bool, fast_forward: bool = True) -> Engine:
    config = SchedulerConfig(policy="continuous", num_blocks=256, block_size=16,
                             max_num_seqs=8, token_budget=512, max_model_len=512)
    engine = Engine(Scheduler(config), AheadBackend(step_s=STEP_S, schedules_ahead=ahead))
    engine.allow_fast_forward = fast_forward
    return engine


def _first_token_steps(ahead: bool, fast_forward: bool = True) -> list[int]:
    """A long request from 0 and a short one arriving mid-way through step 3: the step
    (0-based, of STEP_S each) in which each got its first token."""
    requests = [Request("long", 0.0, 16, 20), Request("late", 2.5 * STEP_S, 16, 2)]
    run_trace(requests, _engine(ahead, fast_forward))
    return [round(r.token_times_s[0] / STEP_S) - 1 for r in requests]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_a_request_arriving_mid_step_joins_the_step_after_next(fast_forward):
    # It arrives during step 2: step 3 was planned when step 2 started.
    assert _first_token_steps(False, fast_forward) == [0, 3]
    assert _first_token_steps(True, fast_forward) == [0, 4]


def test_an_idle_engine_starts_a_request_at_once():
    requests = [Request("a", 0.0, 16, 2), Request("b", 5 * STEP_S, 16, 2)]
    run_trace(requests, _engine(True))
    assert requests[1].token_times_s[0] == pytest.approx(6 * STEP_S)


def test_a_held_request_starts_when_nothing_else_runs():
    # "a" ends with step 1 (its second token); "b" arrives during it: step 2, planned with
    # nothing to run, goes to "b" as soon as the GPU is free.
    requests = [Request("a", 0.0, 16, 2), Request("b", 1.5 * STEP_S, 16, 2)]
    run_trace(requests, _engine(True))
    assert requests[1].token_times_s[0] == pytest.approx(3 * STEP_S)


def test_a_request_that_never_fits_is_refused_at_once_not_held():
    engine = _engine(True)
    engine.add(Request("a", 0.0, 16, 50))
    engine.busy_until = 1.0  # a step in flight
    too_long = Request("big", 0.5, 256 * 16, 1)
    assert engine.add(too_long, now=0.5) is False
    assert too_long.finish_reason is not None and not engine.held


def test_least_requests_counts_the_requests_an_engine_holds():
    # Two replicas, a burst of four arrivals during replica steps: held requests count as
    # queued, so the router still alternates.
    requests = [Request(f"r{i}", 0.0 if i < 2 else 0.5 * STEP_S, 16, 4) for i in range(4)]
    engines = [_engine(True), _engine(True)]
    result = run_cluster(requests, engines, ClusterConfig(
        num_replicas=2, router=RouterConfig("least-requests")))
    assert sorted(len(served) for served in result.served) == [2, 2]
    assert all(r.is_finished for r in requests)
