"""Multi-turn sessions against an in-process `serve --simulate`: each turn carries the answer
the server really generated, and the server's prefix cache sees the conversation."""

from __future__ import annotations

import asyncio

from servelab.bench.client import BenchConfig, bench_requests, run_bench, summarize_bench
from servelab.serve.engine_thread import EngineThreadConfig
from servelab.serve.server import ServerThread, assemble
from servelab.serve.simulated import SimulatedBackend, round_trip_token_ids
from servelab.serve.state import ApiConfig
from servelab.serve.tokenizer import ByteTokenizer
from sim.cost.roofline import AnalyticCostModel
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from workloads import open_trace

SPEC = ("synthetic:users=3,turns=fixed(3),think=fixed(0.01),rate=20,question=fixed(40),"
        "output=fixed(16),system=64")


def simulated_server() -> ServerThread:
    tokenizer = ByteTokenizer()
    config = SchedulerConfig(policy="continuous", num_blocks=1024, block_size=16,
                             max_model_len=1024, enable_prefix_caching=True)
    backend = SimulatedBackend(AnalyticCostModel.preset("llama-3-8b", "h200"),
                               round_trip_token_ids(tokenizer))
    state = assemble(Scheduler(config), backend, tokenizer, tokenizer.vocab_size,
                     ApiConfig("llama-3-8b", 1024), EngineThreadConfig())
    return ServerThread(state)


def test_turns_carry_the_simulated_servers_answers_and_hit_its_prefix_cache():
    trace = open_trace(SPEC)
    tokenizer = ByteTokenizer()
    requests = bench_requests(trace, tokenizer.vocab_size)
    with simulated_server() as server:
        result = asyncio.run(run_bench(requests, BenchConfig(server.url, timeout_s=120)))
    assert result.errors == []
    by_id = {r.request_id: r for r in result.requests}
    pool = set(round_trip_token_ids(tokenizer))
    for session in set(trace.table["session_id"]):
        turns = [by_id[f"{session}-t{k}"] for k in range(3)]
        for before, after in zip(turns, turns[1:], strict=False):
            assert len(before.output_token_ids) == 16
            assert set(before.output_token_ids) <= pool
            carried = before.prompt_token_ids + before.output_token_ids
            assert after.prompt_token_ids[:len(carried)] == carried
    summary = summarize_bench(result)
    # Later turns find their whole history cached (all but the last partial block), first
    # turns their group's system prompt: well over half of all prompt tokens.
    assert result.prefix_cache_hit_rate is not None and result.prefix_cache_hit_rate > 0.5
    assert summary["prefix_cache_hit_rate"] == result.prefix_cache_hit_rate
