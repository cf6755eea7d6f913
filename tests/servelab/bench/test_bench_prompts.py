"""The load client's prompts: prefix segments really shared at token granularity, a salt that
keeps runs apart, Mooncake's 512-token blocks as before."""

from __future__ import annotations

import asyncio

from executor.prompts import synth_prompt_tokens
from servelab.bench.client import BenchConfig, bench_requests, run_bench
from servelab.bench.prompts import first_shared_length, prompt_plans, prompt_tokens
from tests.servelab.bench.bench_fakes import HoldingServer
from workloads import open_trace
from workloads.trace import Trace

VOCAB = 50_000  # wide enough that two random tails do not start alike by chance
GROUPS = "synthetic:n=12,rate=20,system=37,groups=2,question=fixed(20),output=fixed(3)"


def test_requests_of_one_prefix_group_send_identical_leading_tokens_and_differ_after():
    trace = open_trace(GROUPS)
    requests = bench_requests(trace, VOCAB)
    with HoldingServer(hold_for=1, expected=len(requests)) as server:
        result = asyncio.run(run_bench(requests, BenchConfig(server.url, timeout_s=60)))
    assert result.errors == []
    sent = {prompt for kind, prompt in server.events if kind == "start"}
    by_group: dict[int, list[tuple[int, ...]]] = {}
    for request, ids in zip(requests, trace.table["prefix_hash_ids"], strict=True):
        assert tuple(request.prompt_token_ids) in sent
        by_group.setdefault(ids[0], []).append(tuple(request.prompt_token_ids))
    assert len(by_group) == 2 and all(len(p) >= 2 for p in by_group.values())
    for prompts in by_group.values():
        for other in prompts[1:]:
            assert first_shared_length(prompts[0], other) == 37  # the system prompt, no more
    first, second = (prompts[0] for prompts in by_group.values())
    assert first_shared_length(first, second) < 37


def test_token_granular_segments_cover_their_stated_counts():
    """Ids covering 100 and then 7 tokens: rows naming both share 107 tokens, a row naming
    only the first shares 100."""
    trace = Trace.from_arrays("t", [0.0, 0.1, 0.2], [150, 150, 120], [2, 2, 2],
                              prefix_hash_ids=[[5, 6], [5, 6], [5]],
                              prefix_hash_tokens=[[100, 7], [100, 7], [100]])
    a, b, c = (prompt_tokens(p, 1000) for p in prompt_plans(trace, seed=0))
    assert [len(a), len(b), len(c)] == [150, 150, 120]
    assert first_shared_length(a, b) == 107
    assert first_shared_length(a, c) == 100


def test_hash_blocks_without_stated_counts_keep_mooncakes_512_tokens():
    trace = Trace.from_arrays("m", [0.0, 1.0], [700, 1200], [2, 2],
                              request_ids=["x", "y"], prefix_hash_ids=[[1, 2], [1, 3, 4]])
    for plan, rid, ids in zip(prompt_plans(trace, seed=3), ["x", "y"], [[1, 2], [1, 3, 4]],
                              strict=True):
        assert prompt_tokens(plan, 500) == synth_prompt_tokens(f"3:{rid}", plan.prompt_len,
                                                               500, ids)


def test_a_salt_changes_every_segment_and_keeps_sharing_within_it():
    trace = open_trace(GROUPS)
    plain = [r.prompt_token_ids for r in bench_requests(trace, VOCAB)]
    salted = [r.prompt_token_ids for r in bench_requests(trace, VOCAB, salt="stage2")]
    assert all(first_shared_length(p, s) < 5 for p, s in zip(plain, salted, strict=True))
    ids = [row[0] for row in trace.table["prefix_hash_ids"]]
    same = [j for j in range(1, len(ids)) if ids[j] == ids[0]]
    assert same and first_shared_length(salted[0], salted[same[0]]) == 37
