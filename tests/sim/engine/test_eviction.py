"""Eviction honours the waiting queue: the victim is the running request it would serve last,
and a fair queue charges a tenant only for service it received."""

from __future__ import annotations

import pytest

from sim.engine.core import Request, RequestStatus, StepResult
from sim.engine.queues import FairQueue, make_queue
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig


def step(sched: Scheduler, now: float) -> list[str]:
    """One step at `now`; the ids it evicted."""
    plan = sched.schedule(now)
    sched.update(plan, StepResult(0.01), now + 0.01)
    return plan.preempted


def heavy_then_light(queue: str) -> tuple[Scheduler, Request, Request]:
    """A heavy tenant's request runs alone for a step, then a light one is admitted beside
    it, filling the 4-block pool; the step after, the heavy one needs a third block."""
    cfg = SchedulerConfig(policy="recompute", num_blocks=4, block_size=4, max_model_len=16,
                          max_num_seqs=4, queue=queue, queue_aging_s=1e6)
    sched = Scheduler(cfg)
    heavy = Request("heavy", 0.0, 7, 6, tenant="heavy")
    light = Request("light", 0.01, 7, 6, tenant="light")
    sched.add(heavy)
    assert step(sched, 0.0) == []
    sched.add(light)
    assert step(sched, 0.01) == [] and sched.running == [heavy, light]
    return sched, heavy, light


def test_fair_queue_evicts_the_tenant_over_its_share_not_the_newest_request():
    sched, heavy, light = heavy_then_light("fair")
    assert sched.waiting.counters["heavy"] > sched.waiting.counters["light"]
    assert step(sched, 0.02) == ["heavy"]  # it asked for the block and was the victim itself
    assert light.status is RequestStatus.RUNNING and light.num_preemptions == 0
    assert heavy.status is RequestStatus.PREEMPTED and heavy.num_computed_tokens == 0


def test_fcfs_still_evicts_the_newest_request():
    sched, heavy, light = heavy_then_light("fcfs")
    assert step(sched, 0.02) == ["light"]
    assert heavy.status is RequestStatus.RUNNING


@pytest.mark.parametrize("order", ["fcfs", "sjf", "fair", "priority"])
def test_every_queue_names_a_running_victim(order):
    queue = make_queue(order, aging_s=60.0)
    running = [Request(f"r{i}", 0.0, 8, 4, tenant="t", priority=0) for i in range(3)]
    assert queue.victim(running) is running[-1]  # one tenant, one class: the newest


def test_priority_victim_is_the_lowest_class_even_when_it_is_not_the_newest():
    queue = make_queue("priority", aging_s=60.0)
    running: list[Request] = []
    low = Request("low", 0.0, 8, 4, priority=5)
    high = Request("high", 1.0, 8, 4, priority=0)
    for request in (low, high):  # high is admitted last, yet sorts ahead of low
        queue.place(running, request)
    assert running == [high, low] and queue.victim(running) is low


def test_fair_queue_does_not_charge_a_recompute_again():
    queue = FairQueue(aging_s=1e6)
    request = Request("a", 0.0, 10, 5, tenant="a")
    queue.charge(request, 10)  # the prompt: 10
    request.num_computed_tokens = 10
    queue.charge(request, 1)  # one output token: 2 more
    assert queue.counters["a"] == 12.0
    request.num_computed_tokens = 0  # evicted by recompute
    queue.charge(request, 11)  # the whole sequence again: already served
    assert queue.counters["a"] == 12.0
    request.num_computed_tokens = 11
    queue.charge(request, 1)  # past what it had been served: charged
    assert queue.counters["a"] == 14.0
    queue.forget(request)
    request.num_computed_tokens = 0
    queue.charge(request, 1)  # a new life under the same id pays again
    assert queue.counters["a"] == 15.0
