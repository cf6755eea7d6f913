"""Preemption by swap: victims' KV goes to a host pool and back instead of being recomputed."""

from __future__ import annotations

import numpy as np
import pytest

from sim.cost.fixed_backend import ConstantBackend
from sim.cost.roofline import AnalyticCostModel
from sim.engine.core import BatchPlan, Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace


def burst(n: int = 30, seed: int = 0) -> list[Request]:
    rng = np.random.default_rng(seed)
    return [Request(f"r{i}", float(i) * 0.01, int(rng.integers(60, 300)),
                    int(rng.integers(20, 120))) for i in range(n)]


def run(requests: list[Request], **config) -> tuple[Scheduler, int]:
    """Run with a block-manager check after every step; returns the prefill tokens computed."""
    config = {"policy": "chunked", "num_blocks": 60, "max_num_seqs": 16,
              "enable_prefix_caching": False, **config}
    if config["policy"] == "chunked":
        config["token_budget"] = 256
    cfg = SchedulerConfig(**config)
    scheduler = Scheduler(cfg)
    engine = Engine(scheduler, ConstantBackend())
    run_trace(requests, engine, on_step=lambda _t, _f: scheduler.block_manager.check())
    assert all(len(r.token_times_s) == r.max_new_tokens for r in requests)
    return scheduler, sum(s.prefill_tokens for s in engine.steps)


@pytest.mark.parametrize("policy", ["recompute", "chunked"])
def test_swap_resumes_without_recomputing(policy):
    recompute, recomputed = run(burst(), policy=policy)
    swap, swapped = run(burst(), policy=policy, preemption="swap", swap_space_blocks=200)
    prompts = sum(r.prompt_len for r in burst())
    assert recompute.num_preemptions > 0 and recomputed > prompts
    assert swap.num_swapped_out == swap.num_preemptions > 0
    assert swapped == prompts  # every prompt token computed exactly once


def test_a_full_host_pool_falls_back_to_recompute():
    scheduler, _ = run(burst(), preemption="swap", swap_space_blocks=8)
    assert 0 < scheduler.num_swapped_out < scheduler.num_preemptions


def test_plans_carry_the_copies_and_swapped_kv_comes_back_to_new_blocks():
    scheduler = Scheduler(SchedulerConfig("recompute", num_blocks=10, max_num_seqs=4,
                                          preemption="swap", swap_space_blocks=10,
                                          enable_prefix_caching=False))
    a, b = Request("a", 0.0, 64, 40), Request("b", 0.0, 64, 40)
    scheduler.add(a)
    scheduler.add(b)
    outs, ins = [], []
    while scheduler.has_unfinished:
        plan = scheduler.schedule(0.0)
        outs += plan.swap_out
        ins += plan.swap_in
        assert (plan.swap_tokens > 0) == bool(plan.swap_out or plan.swap_in)
        scheduler.update(plan, ConstantBackend().execute(plan), 0.0)
    assert outs and [rid for rid, _, _ in outs] == [rid for rid, _, _ in ins]
    for (_, _, host_out), (_, host_in, _) in zip(outs, ins, strict=True):
        assert host_out == host_in  # the same host blocks come back


def test_aborting_a_swapped_request_frees_its_host_blocks():
    scheduler = Scheduler(SchedulerConfig("recompute", num_blocks=10, max_num_seqs=4,
                                          preemption="swap", swap_space_blocks=10))
    for rid in ("a", "b"):
        scheduler.add(Request(rid, 0.0, 64, 40))
    while not scheduler.block_manager.holds_swapped("b"):
        plan = scheduler.schedule(0.0)
        scheduler.update(plan, ConstantBackend().execute(plan), 0.0)
    scheduler.abort("b")
    assert not scheduler.block_manager.holds_swapped("b")
    scheduler.block_manager.check()


def test_cost_model_prices_swapped_kv_over_the_host_link():
    cost = AnalyticCostModel.preset("llama-3-8b", "h100")
    plan = BatchPlan(swap_tokens=1000)
    per_token = cost.model.kv_bytes_per_token(2)  # 128 KiB
    assert cost.predict(plan) == pytest.approx(1000 * per_token / 64e9)
    decode = BatchPlan(decode_seqs=8, decode_context=8000, num_sampled=8)
    swapping = BatchPlan(decode_seqs=8, decode_context=8000, num_sampled=8, swap_tokens=1000)
    assert cost.predict(swapping) - cost.predict(decode) == pytest.approx(cost.predict(plan))


def test_swap_needs_a_host_pool():
    with pytest.raises(ValueError, match="swap_space_blocks"):
        SchedulerConfig(preemption="swap")
    with pytest.raises(ValueError, match="unknown preemption"):
        SchedulerConfig(preemption="drop")
