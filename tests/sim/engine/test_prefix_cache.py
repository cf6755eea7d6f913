"""Prefix caching: content-keyed blocks shared by reference, cached when free, LRU eviction."""

from __future__ import annotations

import pytest

from sim.cost.fixed_backend import ConstantBackend
from sim.engine.block_hashes import block_hashes
from sim.engine.block_manager import BlockManager
from sim.engine.core import Request, StepResult
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import POLICIES, SchedulerConfig
from sim.engine.step import Engine
from sim.replay.metrics import summarize
from sim.replay.simulation import run_trace
from sim.replay.workload import requests_from_trace
from workloads.trace import PREFIX_BLOCK_TOKENS, Trace

BS = 16


def tokens_request(rid: str, tokens: list[int], max_new: int = 4, arrival_s: float = 0.0
                   ) -> Request:
    return Request(rid, arrival_s, len(tokens), max_new, prompt_token_ids=list(tokens))


def computed(bm: BlockManager, request: Request, num_tokens: int) -> None:
    """As a step would: hold and register the request's first num_tokens tokens."""
    assert bm.try_allocate(request.request_id, num_tokens)
    request.num_computed_tokens = num_tokens
    bm.cache_blocks(request, num_tokens)


def test_equal_prefix_shares_blocks_and_leaves_the_last_token_to_compute():
    bm = BlockManager(32, BS, enable_caching=True)
    first = tokens_request("a", list(range(64)))
    computed(bm, first, 64)
    same = tokens_request("b", list(range(64)))
    hit = bm.cached_prefix(same)
    assert hit == bm.block_table("a")[:3]  # 63 tokens would be 3.9 blocks: 3 full ones
    longer = tokens_request("c", list(range(64)) + [999])
    assert bm.cached_prefix(longer) == bm.block_table("a")
    assert bm.try_allocate("c", 65, bm.cached_prefix(longer))
    assert bm.block_table("c")[:4] == bm.block_table("a")
    assert bm.num_used_blocks == 5  # four shared, one of its own
    bm.check()


def test_a_different_token_anywhere_before_breaks_the_chain():
    bm = BlockManager(32, BS, enable_caching=True)
    computed(bm, tokens_request("a", list(range(64))), 64)
    tokens = list(range(64))
    tokens[20] = 7  # block 1 differs: blocks 2, 3 equal in content but not in prefix
    assert bm.cached_prefix(tokens_request("b", tokens + [1])) == bm.block_table("a")[:1]


def test_freed_blocks_stay_cached_until_the_pool_needs_them():
    bm = BlockManager(6, BS, enable_caching=True)
    computed(bm, tokens_request("a", list(range(64))), 64)
    bm.free("a")
    assert bm.num_free_blocks == 6 and bm.num_cached_blocks == 4
    assert len(bm.cached_prefix(tokens_request("b", list(range(65))))) == 4
    bm.allocate("x", 3 * BS)  # two fresh blocks, then the least recently used cached one
    assert bm.num_cached_blocks == 3
    # The deepest block went first: the first three blocks of the prefix still hit.
    assert len(bm.cached_prefix(tokens_request("b", list(range(65))))) == 3
    bm.check()


def test_a_hit_revives_cached_blocks_and_the_allocation_counts_them():
    bm = BlockManager(4, BS, enable_caching=True)
    computed(bm, tokens_request("a", list(range(64))), 64)
    bm.free("a")
    request = tokens_request("b", list(range(64)) + [5] * 17)
    prefix = bm.cached_prefix(request)
    assert len(prefix) == 4
    # 81 tokens need 6 blocks: 4 cached + 2 new, the pool has none left besides the prefix.
    assert not bm.try_allocate("b", 81, prefix)
    assert bm.num_free_blocks == 4 and not bm.holds("b")  # nothing changed
    bm.check()


def test_trace_hash_ids_key_blocks_within_their_hash_block():
    shared = (11, 12)
    a = Request("a", 0.0, 2 * PREFIX_BLOCK_TOKENS, 1, prefix_hash_ids=shared)
    b = Request("b", 0.0, PREFIX_BLOCK_TOKENS + 100, 1, prefix_hash_ids=shared)
    c = Request("c", 0.0, 2 * PREFIX_BLOCK_TOKENS, 1, prefix_hash_ids=(11, 13))
    per = PREFIX_BLOCK_TOKENS // BS
    ka, kb, kc = (block_hashes(r, 2 * per, BS) for r in (a, b, c))
    assert ka[: per + 6] == kb[: per + 6]  # 100 tokens of hash block 12: 6 full blocks
    assert ka[: per] == kc[: per] and ka[per] != kc[per]
    assert len(set(ka)) == len(ka)  # the offset within a hash block tells blocks apart
    # Tokens no id covers are the request's own, even beyond an equal prefix.
    assert kb[per + 6] != ka[per + 6]


def run(requests, **config) -> tuple[Scheduler, dict]:
    scheduler = Scheduler(SchedulerConfig(block_size=BS, **config))
    result = run_trace(requests, Engine(scheduler, ConstantBackend(0.01, 1e-5)))
    return scheduler, summarize(result)


def shared_prefix_trace(n: int = 20, gap_s: float = 1.0) -> Trace:
    """n requests of two shared 512-token hash blocks plus a private tail, far apart."""
    return Trace.from_arrays("shared", [i * gap_s for i in range(n)], [1100] * n, [8] * n,
                             prefix_hash_ids=[[1, 2, 100 + i] for i in range(n)])


@pytest.mark.parametrize("policy", POLICIES)
def test_simulated_requests_hit_the_prefix_their_trace_shares(policy):
    requests = requests_from_trace(shared_prefix_trace())
    scheduler, summary = run(requests, policy=policy, num_blocks=4096, max_model_len=2048)
    first, *rest = [r.num_cached_tokens for r in requests]
    assert first == 0 and all(cached == 2 * PREFIX_BLOCK_TOKENS for cached in rest)
    expected = 19 * 1024 / (20 * 1100)
    assert summary["prefix_cache_hit_rate"] == pytest.approx(expected)
    assert scheduler.prefix_cache_hits == 19 * 1024
    assert all(r.num_output_tokens == 8 for r in requests)


def test_caching_off_never_hits_and_a_trace_without_ids_never_shares():
    requests = requests_from_trace(shared_prefix_trace())
    scheduler, summary = run(requests, policy="chunked", num_blocks=4096, max_model_len=2048,
                             enable_prefix_caching=False)
    assert summary["prefix_cache_hit_rate"] == 0 and scheduler.prefix_cache_queries == 0
    plain = Trace.from_arrays("plain", [0.0, 1.0], [1100, 1100], [8, 8])
    _, summary = run(requests_from_trace(plain), policy="chunked", num_blocks=4096,
                     max_model_len=2048)
    assert summary["prefix_cache_hit_rate"] == 0


def test_a_fully_cached_prompt_still_samples_its_first_token_from_a_prefill_step():
    scheduler = Scheduler(SchedulerConfig("chunked", num_blocks=64, block_size=BS))
    a = tokens_request("a", list(range(64)), max_new=2)
    scheduler.add(a)
    plan = scheduler.schedule(0.0)
    scheduler.update(plan, StepResult(0.1, {"a": 5}), 0.1)
    b = tokens_request("b", list(range(64)), max_new=2, arrival_s=0.1)
    scheduler.add(b)
    plan = scheduler.schedule(0.1)
    assert plan.num_scheduled_tokens["b"] == 16  # the last block: 63 tokens would be 3.9
    assert b.num_cached_tokens == 48 and b.num_computed_tokens == 48
    scheduler.update(plan, StepResult(0.1, {"a": 6, "b": 7}), 0.2)
    assert b.token_times_s == [0.2]  # its first token, from that prefill step


def test_kv_handed_over_joins_the_cache_at_admission():
    """A P/D decode engine registers the full blocks of a prompt whose KV it received, as
    vLLM caches the blocks a KV connector loaded: the next request with that prefix hits
    them, though the request's own step computed only its last prompt token."""
    scheduler = Scheduler(SchedulerConfig("chunked", num_blocks=64, block_size=BS))
    a = tokens_request("a", list(range(70)), max_new=8)
    a.num_external_tokens = 69  # its KV came from a prefill engine
    scheduler.add(a)
    plan = scheduler.schedule(0.0)
    assert plan.num_scheduled_tokens == {"a": 1}
    assert scheduler.block_manager.num_cached_blocks == 4  # 69 tokens: four full blocks
    scheduler.update(plan, StepResult(0.1, {"a": 5}), 0.1)
    b = tokens_request("b", list(range(64)) + [7, 7], arrival_s=0.1)
    scheduler.add(b)
    scheduler.schedule(0.1)
    assert b.num_cached_tokens == 64
    assert scheduler.block_manager.block_table("b")[:4] == scheduler.block_manager.block_table(
        "a")[:4]


def test_a_request_admitted_in_the_same_step_does_not_hit_blocks_not_yet_computed():
    scheduler = Scheduler(SchedulerConfig("chunked", num_blocks=64, block_size=BS))
    for rid in ("a", "b"):
        scheduler.add(tokens_request(rid, list(range(64))))
    plan = scheduler.schedule(0.0)
    assert plan.num_scheduled_tokens == {"a": 64, "b": 64}
    assert scheduler.prefix_cache_hits == 0


def test_a_preempted_request_finds_its_own_blocks_on_recompute():
    trace = Trace.from_arrays("t", [0.0, 0.0], [100, 100], [100, 100])
    requests = requests_from_trace(trace)
    scheduler, summary = run(requests, policy="recompute", num_blocks=20, max_model_len=512)
    assert scheduler.num_preemptions > 0
    assert scheduler.prefix_cache_hits > 0  # its recompute hit blocks it had computed
    assert summary["prefix_cache_hit_rate"] == 0  # first admissions only: nothing shared
    assert all(r.num_output_tokens == 100 for r in requests)
