"""A decode fast-forward (sim.engine.fast_forward) changes how fast the simulator decides, not what.

Each case replays one workload twice, once with the decode rows fast-forwarded and once with
every row listed (Engine.allow_fast_forward=False), and requires identical token times,
finishes, preemptions, cache hits and per-step records.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from sim.cluster.config import ClusterConfig
from sim.cluster.router import RouterConfig
from sim.cluster.run import run_cluster
from sim.cost.fixed_backend import ConstantBackend
from sim.cost.roofline import AnalyticCostModel
from sim.engine.block_manager import BlockManager
from sim.engine.core import BatchPlan, Request, StepResult
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace
from workloads.trace import PREFIX_BLOCK_TOKENS


class RowReading:
    """The same backend, declared to read every row (so nothing is fast-forwarded)."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def execute(self, plan: BatchPlan) -> StepResult:
        return self.inner.execute(plan)

    def free(self, request: Request) -> None:
        self.inner.free(request)


@dataclass(frozen=True)
class Totals(ConstantBackend):
    """A constant-time backend that also keeps every plan's totals, as cost models read them."""

    step_s: float = 0.01
    per_token_s: float = 2e-5
    seen: list = field(default_factory=list, compare=False)

    def execute(self, plan: BatchPlan) -> StepResult:
        self.seen.append((plan.batch_size, plan.num_sampled, plan.decode_seqs,
                          plan.decode_context, plan.decode_context_max, plan.prefill_tokens,
                          plan.prefill_attn, plan.prefill_seqs))
        return super().execute(plan)


def workload(n: int, rate: float, seed: int, prefixes: int = 0) -> list[Request]:
    """Prompts of 20-1500 tokens, outputs of 1-120, priorities 0-2, optional shared stems."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, n))
    out = []
    for i, t in enumerate(arrivals):
        prompt = int(rng.integers(20, 1500))
        hashes = None
        if prefixes:
            stems = (int(rng.integers(prefixes)),) * int(prompt >= PREFIX_BLOCK_TOKENS)
            hashes = stems + tuple(1000 + i * 8 + j for j in range(
                -(-prompt // PREFIX_BLOCK_TOKENS) - len(stems)))
        out.append(Request(f"r{i}", float(t), prompt, int(rng.integers(1, 120)),
                           prefix_hash_ids=hashes, priority=int(rng.integers(3))))
    return out


def outcome(requests: list[Request], engines: list[Engine]) -> tuple:
    return ([(r.token_times_s, r.finish_s, r.finish_reason, r.num_preemptions,
              r.num_cached_tokens, r.first_scheduled_s) for r in requests],
            [e.steps for e in engines],
            [(e.scheduler.num_preemptions, e.scheduler.prefix_cache_hits) for e in engines])


def replay(backend, config: SchedulerConfig, requests: list[Request],
           cluster: ClusterConfig | None, fast_forward: bool) -> tuple:
    engines = [Engine(Scheduler(config), backend, allow_fast_forward=fast_forward)
               for _ in range(cluster.num_engines if cluster else 1)]
    if cluster:
        run_cluster(requests, engines, cluster)
    else:
        run_trace(requests, engines[0])
    assert all((e.scheduler.fast_forward is not None) == fast_forward for e in engines)
    return outcome(requests, engines)


CASES = {
    "chunked": dict(policy="chunked"),
    "continuous": dict(policy="continuous"),
    "chunked, small pool": dict(policy="chunked", num_blocks=160),
    "recompute, small pool": dict(policy="recompute", num_blocks=160),
    "continuous, small pool": dict(policy="continuous", num_blocks=160),
    "chunked, small budget": dict(policy="chunked", token_budget=64, max_num_seqs=8,
                                  num_blocks=300),
    "chunked, caching, small pool": dict(policy="chunked", num_blocks=200,
                                         enable_prefix_caching=True),
    "priority, small pool": dict(policy="chunked", num_blocks=160, queue="priority"),
    "sjf": dict(policy="continuous", num_blocks=400, queue="sjf"),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("seed", [0, 1])
def test_one_engine_decides_the_same_with_rows_fast_forwarded(name, seed):
    config = SchedulerConfig(**{"num_blocks": 2000, **CASES[name]})
    caching = config.enable_prefix_caching
    seen_fast, seen_listed = Totals(), Totals()
    fast = replay(seen_fast, config, workload(150, 40, seed, 3 * caching), None, True)
    listed = replay(seen_listed, config, workload(150, 40, seed, 3 * caching), None, False)
    assert fast == listed
    assert seen_fast.seen == seen_listed.seen  # every plan total a cost model reads
    preempted = sum(s.num_preempted for s in fast[1][0])
    assert preempted > 0 or "small pool" not in name or config.reserves_full


@pytest.mark.parametrize("router", ["least-requests", "least-kv", "prefix-aware"])
def test_a_cluster_decides_the_same_with_rows_fast_forwarded(router):
    backend = AnalyticCostModel.preset("llama-3-8b", "a100-80gb")
    config = SchedulerConfig(policy="chunked", num_blocks=300, enable_prefix_caching=True)
    cluster = ClusterConfig(num_replicas=3, router=RouterConfig(router))
    fast = replay(backend, config, workload(300, 60, 7, prefixes=4), cluster, True)
    listed = replay(backend, config, workload(300, 60, 7, prefixes=4), cluster, False)
    assert fast == listed


def test_disaggregated_cluster_decides_the_same_with_rows_fast_forwarded():
    backend = AnalyticCostModel.preset("llama-3-8b", "h100")
    config = SchedulerConfig(policy="chunked", num_blocks=120)  # decode engines preempt
    cluster = ClusterConfig(router=RouterConfig("least-requests"), num_prefill=1,
                            num_decode=3, kv_link_gbps=10.0, kv_bytes_per_token=131072)
    fast = replay(backend, config, workload(200, 30, 3), cluster, True)
    listed = replay(backend, config, workload(200, 30, 3), cluster, False)
    assert fast == listed


def test_fast_forward_is_off_where_rows_are_read_for_per_row_policies_and_when_disallowed():
    engine = Engine(Scheduler(SchedulerConfig()), RowReading(ConstantBackend()))
    assert not engine.start_fast_forward()
    for config in (SchedulerConfig(policy="static"), SchedulerConfig(queue="fair"),
                   SchedulerConfig(preemption="swap", swap_space_blocks=10)):
        assert not Engine(Scheduler(config), ConstantBackend()).start_fast_forward()
    engine = Engine(Scheduler(SchedulerConfig()), ConstantBackend(), allow_fast_forward=False)
    assert not engine.start_fast_forward()
    assert engine.scheduler.fast_forward is None
    assert Engine(Scheduler(SchedulerConfig()), ConstantBackend()).start_fast_forward()


def test_fast_forward_must_start_before_the_first_request():
    engine = Engine(Scheduler(SchedulerConfig()), ConstantBackend())
    engine.add(Request("r0", 0.0, 10, 5))
    with pytest.raises(RuntimeError, match="before the first request"):
        engine.start_fast_forward()


def test_add_blocks_gives_the_blocks_one_block_allocations_would_and_nothing_when_short():
    def pool() -> BlockManager:
        bm = BlockManager(num_blocks=10, block_size=4)
        for rid, tokens in (("a", 8), ("x", 12), ("b", 4)):
            bm.allocate(rid, tokens)
        bm.free("x")  # three empty blocks, reused top of the stack first, then fresh ones
        return bm

    bulk, single = pool(), pool()
    assert bulk.add_blocks(["a", "b", "a", "b"])
    for rid, tokens in (("a", 12), ("b", 8), ("a", 16), ("b", 12)):
        single.allocate(rid, tokens)
    for rid in ("a", "b"):
        assert bulk.block_table(rid) == single.block_table(rid)
    bulk.check()
    before = {rid: list(bulk.block_table(rid)) for rid in ("a", "b")}
    assert not bulk.add_blocks(["a"] * (bulk.num_free_blocks + 1))
    assert {rid: bulk.block_table(rid) for rid in ("a", "b")} == before
    bulk.check()
