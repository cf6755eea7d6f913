"""The front end's per-request time lands in each request's TTFT exactly once, in every
replay that prices vLLM (one engine, lockstep data-parallel ranks)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sim.cluster.dp_lockstep import run_lockstep
from sim.cost.engine_overhead import EngineOverhead
from sim.cost.gpu_cost import GpuCostModel
from sim.cost.gpu_shapes import known_gpu, known_shapes
from sim.engine.core import Request
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace

BARE = EngineOverhead("bare", 1e-3, 0.0, 1e-5, "", overlapped=True, graph_max_rows=512)
REQUEST_S = 0.0125
CONFIG = SchedulerConfig(policy="chunked", num_blocks=4096, max_num_seqs=8)


def _requests() -> list[Request]:
    # Far apart: each request runs alone, so the delay shifts it without changing its batch.
    return [Request(f"r{i}", 1.0 * i, 64 + 16 * i, 6) for i in range(4)]


def _times(requests: list[Request]) -> list[tuple[float, float]]:
    """(TTFT, time from first token to finish) of each request."""
    return [(r.token_times_s[0] - r.arrival_s, r.finish_s - r.token_times_s[0]) for r in requests]


def test_the_request_time_is_added_to_each_ttft_once_and_to_no_token_after():
    def run(engine: EngineOverhead) -> list[tuple[float, float]]:
        model = GpuCostModel(known_shapes("llama-3-8b"), known_gpu("h100"), engine)
        return _times(run_trace(_requests(), Engine(Scheduler(CONFIG), model)).requests)

    bare, slow = run(BARE), run(replace(BARE, request_s=REQUEST_S))
    for (ttft0, rest0), (ttft1, rest1) in zip(bare, slow, strict=True):
        assert ttft1 == pytest.approx(ttft0 + REQUEST_S, abs=1e-9)
        assert rest1 == pytest.approx(rest0, abs=1e-9)


def test_lockstep_ranks_add_the_request_time_to_each_ttft_once():
    def run(engine: EngineOverhead) -> list[tuple[float, float]]:
        model = GpuCostModel(known_shapes("qwen3-30b-a3b"), known_gpu("rtx-pro-6000"), engine,
                             expert_parallel=2)
        engines = [Engine(Scheduler(CONFIG), model) for _ in range(2)]
        return _times(run_lockstep(_requests(), engines, model).requests)

    bare, slow = run(BARE), run(replace(BARE, request_s=REQUEST_S))
    for (ttft0, rest0), (ttft1, rest1) in zip(bare, slow, strict=True):
        assert ttft1 == pytest.approx(ttft0 + REQUEST_S, abs=1e-9)
        assert rest1 == pytest.approx(rest0, abs=1e-9)
