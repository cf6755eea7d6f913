"""The overload verdict: a light run is stable, an overloaded one falls behind at about the
rate the arrivals exceed what the engine serves, and names the limit that held it back."""

from __future__ import annotations

import pandas as pd
import pytest

from sim.cost.fixed_backend import ConstantBackend
from sim.engine.scheduler import SchedulerConfig
from sim.policy_runs import simulate_policy
from sim.replay.overload import EngineLimits, binding_resource, queue_growth_rps
from workloads import open_trace

# A 10 ms step, 4 running requests at most, 10 output tokens each: the engine completes at
# most 4 requests per 100 ms, i.e. 40 req/s, whatever the arrivals.
BACKEND = ConstantBackend(step_s=0.010)
SEQS_BOUND = SchedulerConfig(policy="continuous", num_blocks=1024, max_num_seqs=4,
                             max_model_len=256)


def verdict(rate: float, config: SchedulerConfig = SEQS_BOUND, n: int = 400):
    spec = f"synthetic:n={n},rate={rate},arrival=constant,prompt=fixed(16),output=fixed(10)"
    return simulate_policy(open_trace(spec), config, BACKEND, None, False).verdict


def test_a_light_run_is_stable():
    v = verdict(rate=5)
    assert v.state == "stable"
    assert abs(v.queue_growth_rps) < 0.5
    assert v.sustainable_rps >= 5  # a lower bound at light load: it served what came


def test_an_overloaded_run_falls_behind_bound_by_sequences():
    v = verdict(rate=100)
    assert v.state == "falling behind"
    assert v.binding == "sequences" and v.binding_share > 0.9
    # Served ~40 req/s (each admission's prefill rides a step with the others' decodes);
    # the queue takes the rest of the 100 req/s offered.
    assert v.sustainable_rps == pytest.approx(40, rel=0.1)
    assert v.queue_growth_rps == pytest.approx(100 - v.sustainable_rps, rel=0.15)


def test_a_small_kv_pool_binds_before_the_sequences():
    config = SchedulerConfig(policy="continuous", num_blocks=8, block_size=16,
                             max_num_seqs=64, max_model_len=256)
    v = verdict(rate=100, config=config)
    assert v.state == "falling behind" and v.binding == "KV blocks"


def steps_table(**columns) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    base = {"start_s": [0.01 * i for i in range(n)], "duration_s": [0.01] * n,
            "num_tokens": [1] * n, "kv_blocks_used": [0] * n, "num_waiting": [1] * n,
            "batch_size": [1] * n, "num_preempted": [0] * n}
    return pd.DataFrame({**base, **columns})


def test_binding_resource_reads_each_limit_from_the_steps():
    limits = EngineLimits(num_blocks=100, token_budget=512, max_num_seqs=8)
    assert binding_resource(steps_table(num_tokens=[512, 512, 1]), limits) == (
        "token budget", pytest.approx(2 / 3))
    assert binding_resource(steps_table(num_preempted=[1, 0]), limits)[0] == "KV blocks"
    assert binding_resource(steps_table(num_waiting=[0, 0]), limits) == ("none", 0.0)
    assert binding_resource(steps_table(batch_size=[8, 8, 1]), limits)[0] == "sequences"
    assert binding_resource(steps_table(batch_size=[1, 1]), limits)[0] == "compute"


def test_queue_growth_is_read_over_the_second_half_of_arrivals_only():
    # The queue rises 2 per second while requests arrive (0-10 s), then drains.
    times = [0.5 * i for i in range(40)]
    waiting = [2 * t if t <= 10 else max(0, 20 - 4 * (t - 10)) for t in times]
    steps = steps_table(num_waiting=waiting).assign(start_s=times, duration_s=0.5)
    assert queue_growth_rps(steps, first_arrival_s=0.0, span_s=10.0) == pytest.approx(2.0)
