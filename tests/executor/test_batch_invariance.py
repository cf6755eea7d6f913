"""The non-negotiable: every request's output, greedy or seeded sampling, is identical to
running it alone, under every policy, including chunked prefill, preemption by recompute or
by swap to host memory, and prompts whose prefix KV comes from the prefix cache."""

from __future__ import annotations

import numpy as np
import pytest

from executor.backend import ModelBackend
from executor.prompts import synth_prompt_tokens
from sim.engine.core import Request, SamplingParams
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace
from tests.executor.helpers import TINY, FixedClock, make_request

STEP_S = 0.001  # a fixed clock: batch composition must not hang on measured times
MAX_MODEL_LEN = 128


SYSTEM_PROMPT = synth_prompt_tokens("system", 40, TINY.vocab_size)


def workload(shared_prefixes: bool = False) -> list[Request]:
    """12 requests arriving over ~30 steps; odd ones sample (temperature, top-k, top-p).

    With shared_prefixes, two in three start with one 40-token system prompt, and r0's prompt
    comes back whole as r9's: the prefix cache serves their first blocks."""
    rng = np.random.default_rng(5)
    requests = []
    for i in range(12):
        sampling = SamplingParams() if i % 2 == 0 else SamplingParams(
            temperature=0.9, top_k=40, top_p=0.95, seed=100 + i)
        request = make_request(
            f"r{i}", int(rng.integers(3, 70)), int(rng.integers(4, 25)), sampling,
            arrival_s=float(round(rng.uniform(0, 30)) * STEP_S),
        )
        if shared_prefixes and i % 3:
            request.prompt_token_ids = SYSTEM_PROMPT + request.prompt_token_ids[:30]
            request.prompt_len = len(request.prompt_token_ids)
        requests.append(request)
    if shared_prefixes:
        first, again = requests[0], requests[9]
        again.prompt_token_ids, again.prompt_len = list(first.prompt_token_ids), first.prompt_len
        again.arrival_s = max(again.arrival_s, first.arrival_s + 10 * STEP_S)
    return sorted(requests, key=lambda r: r.arrival_s)


def run(model, requests: list[Request], **config) -> tuple[dict[str, list[int]], Scheduler]:
    scheduler = Scheduler(SchedulerConfig(block_size=16, max_model_len=MAX_MODEL_LEN, **config))
    engine = Engine(scheduler, FixedClock(ModelBackend(model, scheduler.block_manager), STEP_S))
    run_trace(requests, engine)
    assert all(r.num_output_tokens == r.max_new_tokens for r in requests)
    return {r.request_id: r.output_token_ids for r in requests}, scheduler


def alone(model, requests: list[Request]) -> dict[str, list[int]]:
    """Each request's output run by itself, nothing cached."""
    outputs = {}
    for request in requests:
        request.arrival_s = 0.0
        outputs.update(run(model, [request], policy="continuous", num_blocks=16,
                           enable_prefix_caching=False)[0])
    return outputs


@pytest.fixture(scope="module")
def outputs_alone(tiny_model) -> dict[str, list[int]]:
    return alone(tiny_model, workload())


@pytest.fixture(scope="module")
def shared_outputs_alone(tiny_model) -> dict[str, list[int]]:
    return alone(tiny_model, workload(shared_prefixes=True))


POLICIES = {
    "static": dict(policy="static", num_blocks=256, max_num_seqs=4),
    "continuous": dict(policy="continuous", num_blocks=256, max_num_seqs=8),
    # 12 blocks of 16 tokens hold about two requests: evictions and recomputes are certain.
    "recompute": dict(policy="recompute", num_blocks=12, max_num_seqs=8),
    "chunked": dict(policy="chunked", num_blocks=12, max_num_seqs=8, token_budget=16),
    # The same evictions, the victims' KV copied to host memory and back instead.
    "recompute-swap": dict(policy="recompute", num_blocks=12, max_num_seqs=8,
                           preemption="swap", swap_space_blocks=6),
    "chunked-swap": dict(policy="chunked", num_blocks=12, max_num_seqs=8, token_budget=16,
                         preemption="swap", swap_space_blocks=6),
}


@pytest.mark.parametrize("name", list(POLICIES))
def test_outputs_match_running_alone(tiny_model, outputs_alone, name):
    outputs, scheduler = run(tiny_model, workload(), **POLICIES[name])
    if POLICIES[name]["num_blocks"] < 16:
        assert scheduler.num_preemptions > 0
    if "swap" in name:
        assert 0 < scheduler.num_swapped_out <= scheduler.num_preemptions
    mismatched = [rid for rid in outputs_alone if outputs[rid] != outputs_alone[rid]]
    assert not mismatched, f"{name}: outputs differ from running alone for {mismatched}"
    assert any(len(set(tokens)) > 1 for tokens in outputs.values())


@pytest.mark.parametrize("name", list(POLICIES))
def test_outputs_with_prefix_cache_hits_match_running_alone(tiny_model, shared_outputs_alone,
                                                            name):
    requests = workload(shared_prefixes=True)
    outputs, scheduler = run(tiny_model, requests, **POLICIES[name])
    assert scheduler.prefix_cache_hits > 0
    assert sum(r.num_cached_tokens for r in requests) > 0  # hits at first admission too
    mismatched = [rid for rid in shared_outputs_alone
                  if outputs[rid] != shared_outputs_alone[rid]]
    assert not mismatched, f"{name}: cached prefixes changed the outputs of {mismatched}"
