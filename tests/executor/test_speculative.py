"""Speculative decoding on the real model: greedy outputs are bit-identical with and without
n-gram proposals, under every iteration-level policy, preemption included."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from executor.backend import ModelBackend
from executor.sampling import Sampler
from sim.cost.fixed_backend import ConstantBackend
from sim.engine.core import Request, SamplingParams
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.speculation.acceptance import read_recorded
from sim.engine.speculation.config import SpeculativeConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace
from tests.executor.helpers import FixedClock, bundled_greedy_runs
from tests.executor.test_batch_invariance import (
    MAX_MODEL_LEN,
    POLICIES,
    STEP_S,
    run,
    workload,
)

NGRAM = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)


@pytest.fixture(scope="module")
def outputs_plain(tiny_model) -> dict[str, list[int]]:
    return run(tiny_model, workload(), **POLICIES["continuous"])[0]


@pytest.mark.parametrize("name", ["continuous", "recompute", "chunked"])
def test_speculative_outputs_are_bit_identical_to_plain_decoding(tiny_model, outputs_plain,
                                                                 name):
    requests = workload()
    greedy = {r.request_id for r in requests if r.sampling.temperature == 0.0}
    outputs, scheduler = run(tiny_model, requests, speculative=NGRAM, **POLICIES[name])
    mismatched = [rid for rid in greedy if outputs[rid] != outputs_plain[rid]]
    assert not mismatched, f"{name}: speculation changed the outputs of {mismatched}"
    spec = scheduler.speculator
    assert spec.num_drafts > 0 and spec.num_accepted_tokens > 0  # verification really ran
    scheduler.block_manager.check()
    assert scheduler.block_manager.num_used_blocks == 0


def test_rejection_sampling_keeps_the_target_distribution():
    """A proposal of the second most likely token, verified by many seeds: the first token's
    frequencies match softmax(logits / T), and after an accepted proposal the next token's
    match the next position's distribution."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -1.0],
                           [0.0, 1.0, 2.0, 0.0, -1.0, 0.5]])
    params = dict(temperature=0.8)
    target = [torch.softmax(row / 0.8, dim=-1) for row in logits]
    n = 6000
    first, after_accept = torch.zeros(6), torch.zeros(6)
    sampler = Sampler()
    for seed in range(n):
        request = Request(f"s{seed}", 0.0, 2, 4, prompt_token_ids=[0, 1],
                          sampling=SamplingParams(seed=seed, **params))
        tokens = sampler.verify(logits, request, [1])
        first[tokens[0]] += 1
        if tokens[0] == 1 and len(tokens) == 2:
            after_accept[tokens[1]] += 1
    for counts, p in ((first, target[0]), (after_accept, target[1])):
        total = counts.sum()
        bound = 5 * torch.sqrt(p * (1 - p) / total) + 1e-3  # 5 standard errors
        assert torch.all((counts / total - p).abs() < bound), (counts / total, p)


def test_sampled_rows_speculate_and_still_complete(tiny_model):
    requests = workload()
    _, scheduler = run(tiny_model, requests, speculative=NGRAM, **POLICIES["recompute"])
    assert all(r.num_output_tokens == r.max_new_tokens for r in requests)
    scheduler.block_manager.check()


def test_greedy_outputs_on_the_bundled_trace_are_bit_identical(tiny_model):
    """The first 16 azure-conv requests (prompts <= 64, outputs <= 32 tokens), chunked
    prefill: n-gram speculation changes no greedy token."""
    outputs, schedulers = bundled_greedy_runs(tiny_model, (None, NGRAM))
    assert outputs[0] == outputs[1]
    assert schedulers[1].speculator.num_accepted_tokens > 0
    assert all(len(tokens) > 0 for tokens in outputs[0].values())


def test_a_simulation_from_the_record_verifies_the_same_drafts(tiny_model, tmp_path):
    """A measured n-gram run's record replayed by the simulator, on another clock and so in
    other batches: every request verifies the same proposals at the same output tokens and
    accepts as many, so its steps are the measured ones."""
    measured = workload()
    scheduler = Scheduler(SchedulerConfig(block_size=16, max_model_len=MAX_MODEL_LEN,
                                          speculative=NGRAM))
    scheduler.speculator.record_requests = True
    run_trace(measured, Engine(scheduler, FixedClock(
        ModelBackend(tiny_model, scheduler.block_manager), STEP_S)))
    record = scheduler.speculator.per_request()
    assert sum(len(r["drafts"]) for r in record.values()) == scheduler.speculator.num_drafts
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"results": {"continuous": {
        **scheduler.speculator.metrics(), "spec_per_request": record}}}))
    config = replace(NGRAM, acceptance_rates=(), recorded=read_recorded(path, 3))
    simulated = [Request(r.request_id, 0.0, r.prompt_len, r.max_new_tokens) for r in measured]
    replay = Scheduler(SchedulerConfig(block_size=16, max_model_len=MAX_MODEL_LEN,
                                       speculative=config))
    replay.speculator.record_requests = True
    run_trace(simulated, Engine(replay, ConstantBackend(0.01)))
    assert replay.speculator.per_request() == record
