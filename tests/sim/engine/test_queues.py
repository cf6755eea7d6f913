"""Queue orders (--queue): priority, fair (VTC), sjf, and the aging bound they all keep."""

from __future__ import annotations

import numpy as np
import pytest

from sim.cost.fixed_backend import ConstantBackend
from sim.engine.core import Request
from sim.engine.queues import FairQueue, predicted_output_len
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.metrics import jain_index, max_min_shares, summarize
from sim.replay.simulation import run_trace

BACKEND = ConstantBackend(step_s=0.02, per_token_s=2e-5)


def overload(n: int = 400, rate: float = 40.0, seed: int = 0, **fields) -> list[Request]:
    """Poisson arrivals above what one engine of `config()` serves; fields: per-request
    callables of (index, rng) for tenant / priority."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    out = []
    for i, t in enumerate(arrivals):
        request = Request(f"r{i}", float(t), int(rng.integers(100, 600)),
                          int(rng.integers(5, 120)))
        for name, draw in fields.items():
            setattr(request, name, draw(i, rng))
        out.append(request)
    return out


def run(requests: list[Request], **config) -> dict:
    cfg = SchedulerConfig(**{"policy": "chunked", "num_blocks": 600, "max_num_seqs": 16,
                             "token_budget": 512, **config})
    return summarize(run_trace(requests, Engine(Scheduler(cfg), BACKEND)))


def test_priority_serves_the_high_class_first_under_overload():
    def draw(i, rng):
        return int(rng.integers(2))  # 0 high, 1 low

    fcfs = run(overload(priority=draw))
    prio = run(overload(priority=draw), queue="priority", queue_aging_s=1e6)
    assert prio["completed"] == 400
    high, low = prio["priorities"]["0"], prio["priorities"]["1"]
    assert high["p99_ttft_ms"] < low["p99_ttft_ms"] / 2
    assert high["p99_ttft_ms"] < fcfs["priorities"]["0"]["p99_ttft_ms"] / 2


def test_priority_preempts_a_lower_class_running_request_for_room():
    low = [Request(f"low{i}", 0.0, 400, 200, priority=5) for i in range(3)]
    high = Request("high", 0.5, 400, 10, priority=0)
    cfg = SchedulerConfig("chunked", num_blocks=80, max_num_seqs=4, token_budget=512,
                          queue="priority")
    scheduler = Scheduler(cfg)
    result = run_trace([*low, high], Engine(scheduler, BACKEND))
    assert all(r.is_finished and len(r.token_times_s) == r.max_new_tokens
               for r in result.requests)
    assert scheduler.num_preemptions >= 1 and high.num_preemptions == 0
    assert high.token_times_s[-1] < min(r.token_times_s[-1] for r in low)


@pytest.mark.parametrize("queue", ["priority", "fair", "sjf"])
def test_no_later_arrival_is_admitted_ahead_of_an_overdue_request(queue):
    aging_s = 3.0
    requests = overload(600, 50, seed=1, priority=lambda i, rng: int(rng.integers(3)),
                        tenant=lambda i, rng: "flood" if rng.random() < 0.9 else "light")
    run(requests, queue=queue, queue_aging_s=aging_s, sjf_noise=0.5)
    first = sorted(requests, key=lambda r: r.arrival_s)
    admitted = np.array([r.first_scheduled_s for r in first])
    arrival = np.array([r.arrival_s for r in first])
    # For each request, the latest first admission among requests that arrived after it.
    later_max = np.maximum.accumulate(admitted[::-1])[::-1]
    overtaken = later_max[1:] > admitted[:-1]  # some later arrival went first
    waited = admitted[:-1] - arrival[:-1]
    assert overtaken.any() and waited.max() > aging_s  # the bound is exercised
    # Whoever overtook it was admitted before the request had waited aging_s.
    for i in np.flatnonzero(overtaken):
        after = admitted[i + 1:]
        jumped = after[after < admitted[i]]
        assert (jumped - arrival[i] <= aging_s + 1e-9).all()


def two_tenants(seed: int = 0) -> list[Request]:
    # "flood" sends 10x "light"'s rate; together they overload the engine.
    return overload(660, 40, seed=seed,
                    tenant=lambda i, rng: "light" if rng.random() < 1 / 11 else "flood")


def test_fair_queue_protects_the_light_tenant_from_the_flood():
    fcfs = run(two_tenants())
    fair = run(two_tenants(), queue="fair", queue_aging_s=1e6)
    assert fair["completed"] == fcfs["completed"] == 660
    light_fcfs, light_fair = fcfs["tenants"]["light"], fair["tenants"]["light"]
    assert light_fair["p99_ttft_ms"] <= light_fcfs["p99_ttft_ms"] / 2
    assert fair["jain_fairness_index"] > fcfs["jain_fairness_index"]


def test_fair_queue_keeps_protecting_the_light_tenant_past_any_aging_bound_by_default():
    """Under a flood that outlasts an arrival-order bound, such a bound turns fair back into
    FCFS (the light tenant waits as long as the flood); fair's own default has none."""
    fcfs = run(two_tenants())
    fair = run(two_tenants(), queue="fair")
    aged = run(two_tenants(), queue="fair", queue_aging_s=5.0)
    light = {name: r["tenants"]["light"]["p99_ttft_ms"] for name, r in
             (("fcfs", fcfs), ("fair", fair), ("aged", aged))}
    assert fcfs["tenants"]["flood"]["p99_ttft_ms"] > 5e3  # the backlog outgrows 5 s
    assert light["fair"] <= light["fcfs"] / 10
    assert light["aged"] >= light["fcfs"] / 2


def test_aging_defaults_to_60_s_for_priority_and_sjf_and_to_none_for_fair():
    assert SchedulerConfig(queue="priority").aging_s == SchedulerConfig(queue="sjf").aging_s
    assert SchedulerConfig(queue="sjf").aging_s == 60.0
    assert SchedulerConfig(queue="fair").aging_s == float("inf")
    assert SchedulerConfig(queue="fair", queue_aging_s=7.0).aging_s == 7.0


def test_vtc_lifts_a_returning_tenant_to_the_smallest_waiting_counter():
    queue = FairQueue(aging_s=1e6)
    a1, a2, b = (Request(i, 0.0, 10, 5, tenant=t) for i, t in (("a1", "a"), ("a2", "a"),
                                                                ("b", "b")))
    queue.append(a1)
    queue.append(a2)
    queue.charge(a1, 10)  # 10 prompt tokens: counter 10
    queue.take(a1)
    queue.append(b)  # b was idle: lifted to a's 10, not left at 0
    assert queue.counters == {"a": 10.0, "b": 10.0}
    queue.charge(b, 12)  # 10 prompt + 2 output tokens: 10 + 2 x 2
    assert queue.counters["b"] == 24.0 and queue.head(0.0) is a2


def test_sjf_oracle_beats_fcfs_and_noise_erodes_the_gain():
    mean = {noise: run(overload(seed=2), queue="sjf", queue_aging_s=1e6, sjf_noise=noise)[
        "mean_e2el_ms"] for noise in (0.0, 3.0)}
    fcfs = run(overload(seed=2))["mean_e2el_ms"]
    assert mean[0.0] < 0.8 * fcfs
    assert mean[0.0] < mean[3.0]


def test_sjf_prediction_is_stable_per_request_and_exact_without_noise():
    request = Request("x", 0.0, 10, 100)
    assert predicted_output_len(request, 0.0) == 100
    assert predicted_output_len(request, 1.0) == predicted_output_len(request, 1.0) != 100


def test_jain_index_bounds_and_max_min_shares():
    assert jain_index([1, 1, 1]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert max_min_shares([10, 100, 100], 110) == [10, 50, 50]
    assert max_min_shares([10, 20], 100) == [10, 20]


@pytest.mark.parametrize("field, value, message", [
    ("queue", "lifo", "unknown queue"), ("queue_aging_s", 0, "queue_aging_s"),
    ("sjf_noise", -1, "sjf_noise")])
def test_bad_queue_settings_raise(field, value, message):
    with pytest.raises(ValueError, match=message):
        SchedulerConfig(**{field: value})


@pytest.mark.parametrize("queue", ["priority", "fair", "sjf"])
def test_a_preempted_request_goes_ahead_of_later_arrivals_of_its_class(queue):
    from sim.engine.queues import make_queue

    waiting = make_queue(queue, aging_s=1e6)
    old = Request("old", 0.0, 10, 5, priority=1, tenant="t")
    for i in range(3):
        waiting.append(Request(f"new{i}", 1.0 + i, 10, 5, priority=1, tenant="t"))
    waiting.appendleft(old)  # evicted: it arrived before every request waiting
    assert waiting.head(5.0) is old
