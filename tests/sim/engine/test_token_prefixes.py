"""Token-granular prefixes: trace segments of any length key the simulator's prefix cache."""

from __future__ import annotations

import pytest

from sim.engine.block_manager import BlockManager
from sim.engine.core import Request

BS = 16


def segment_request(rid: str, prompt_len: int, ids: tuple, tokens: tuple) -> Request:
    return Request(rid, 0.0, prompt_len, 4, prefix_hash_ids=ids, prefix_hash_tokens=tokens)


def computed(bm: BlockManager, request: Request) -> None:
    assert bm.try_allocate(request.request_id, request.prompt_len)
    request.num_computed_tokens = request.prompt_len
    bm.cache_blocks(request, request.prompt_len)


def test_a_100_token_shared_prefix_hits_exactly_6_blocks_of_16_per_request_after_the_first():
    bm = BlockManager(256, BS, enable_caching=True)
    # Each request: the shared 100-token system prompt (id 7), then its own 447-token question.
    first = segment_request("r0", 547, (7, 100), (100, 447))
    computed(bm, first)
    for i in range(1, 5):
        request = segment_request(f"r{i}", 547, (7, 100 + i), (100, 447))
        hit = bm.cached_prefix(request)
        assert len(hit) * BS == 96  # block 6 holds tokens 96..111: prefix and question
        assert bm.try_allocate(request.request_id, 547, hit)
        request.num_computed_tokens = 547
        bm.cache_blocks(request, 547)
    bm.check()


def test_the_same_prompt_again_hits_every_full_block_but_the_last_token():
    bm = BlockManager(256, BS, enable_caching=True)
    computed(bm, segment_request("a", 547, (7, 100), (100, 447)))
    again = segment_request("b", 547, (7, 100), (100, 447))
    assert len(bm.cached_prefix(again)) == 546 // BS  # 34 blocks, 544 tokens


def test_a_prefix_only_the_ids_cover_is_never_shared_past_its_end():
    bm = BlockManager(256, BS, enable_caching=True)
    computed(bm, segment_request("a", 300, (7,), (100,)))  # the rest of the prompt: its own
    same_prefix = segment_request("b", 300, (7,), (100,))
    assert len(bm.cached_prefix(same_prefix)) == 6


def test_segments_shifted_by_a_token_share_nothing():
    bm = BlockManager(256, BS, enable_caching=True)
    computed(bm, segment_request("a", 300, (7, 8), (100, 100)))
    shifted = segment_request("b", 300, (6, 7, 8), (1, 100, 100))
    assert bm.cached_prefix(shifted) == []


def test_a_simulated_conversation_finds_each_earlier_turn_in_the_cache():
    from sim.cost.fixed_backend import ConstantBackend
    from sim.engine.scheduler import Scheduler
    from sim.engine.scheduler_config import SchedulerConfig
    from sim.engine.step import Engine
    from sim.replay.metrics import summarize
    from sim.replay.simulation import run_trace
    from sim.replay.workload import requests_from_trace
    from workloads import open_trace
    from workloads.summary import prefix_reuse_ceiling

    trace = open_trace("synthetic:users=20,rate=1,turns=fixed(4),think=fixed(5),"
                       "question=fixed(100),output=fixed(20)")
    config = SchedulerConfig(policy="chunked", num_blocks=4096, block_size=BS,
                             enable_prefix_caching=True)
    scheduler = Scheduler(config)
    result = run_trace(requests_from_trace(trace), Engine(scheduler, ConstantBackend()))
    hit_rate = summarize(result)["prefix_cache_hit_rate"]
    # Nothing is evicted from a pool this large: the simulator finds what the trace shares.
    assert hit_rate == pytest.approx(prefix_reuse_ceiling(trace, BS), abs=1e-9)
    assert hit_rate > 0.4
