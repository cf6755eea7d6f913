"""Speculative decoding by a draft model on the real model: greedy outputs bit-identical to
plain decoding under every iteration-level policy, and rejection sampling against the
drafter's distribution q keeps the target's."""

from __future__ import annotations

import pytest
import torch

from executor.backend import ModelBackend
from executor.speculative.drafter import build_drafter, first_layers_model
from executor.speculative.verify import rejection_sample
from sim.engine.core import Request, SamplingParams
from sim.engine.scheduler import Scheduler
from sim.engine.scheduler_config import SchedulerConfig
from sim.engine.speculation.config import SpeculativeConfig
from sim.engine.step import Engine
from sim.replay.simulation import run_trace
from tests.executor.helpers import FixedClock, bundled_greedy_runs
from tests.executor.test_batch_invariance import MAX_MODEL_LEN, POLICIES, STEP_S, workload

FIRST_LAYER = SpeculativeConfig(method="draft_model", draft_num_layers=1,
                                num_speculative_tokens=3)
SAME_PRESET = SpeculativeConfig(method="draft_model", model="tiny", num_speculative_tokens=3)


def run(model, requests, speculative=None, **config):
    scheduler = Scheduler(SchedulerConfig(block_size=16, max_model_len=MAX_MODEL_LEN,
                                          speculative=speculative, **config))
    drafter = build_drafter(speculative, model, scheduler.block_manager)
    backend = ModelBackend(model, scheduler.block_manager, drafter=drafter)
    run_trace(requests, Engine(scheduler, FixedClock(backend, STEP_S)))
    assert all(r.num_output_tokens == r.max_new_tokens for r in requests)
    return {r.request_id: r.output_token_ids for r in requests}, scheduler


@pytest.fixture(scope="module")
def outputs_plain(tiny_model) -> dict[str, list[int]]:
    return run(tiny_model, workload(), **POLICIES["continuous"])[0]


@pytest.mark.parametrize("name", ["continuous", "recompute", "chunked"])
def test_draft_model_outputs_are_bit_identical_to_plain_decoding(tiny_model, outputs_plain,
                                                                 name):
    requests = workload()
    greedy = {r.request_id for r in requests if r.sampling.temperature == 0.0}
    outputs, scheduler = run(tiny_model, requests, FIRST_LAYER, **POLICIES[name])
    mismatched = [rid for rid in greedy if outputs[rid] != outputs_plain[rid]]
    assert not mismatched, f"{name}: the draft model changed the outputs of {mismatched}"
    spec = scheduler.speculator
    assert spec.num_drafts > 0 and spec.num_accepted_tokens > 0  # verification really ran
    scheduler.block_manager.check()
    assert scheduler.block_manager.num_used_blocks == 0


def test_the_targets_own_weights_as_drafter_are_always_accepted(tiny_model):
    """The same preset and seed drafts exactly what the target decodes: every greedy
    proposal is accepted, so the drafter's KV and its rollback hold across steps."""
    requests = [r for r in workload() if r.sampling.temperature == 0.0]
    _, scheduler = run(tiny_model, requests, SAME_PRESET, **POLICIES["chunked"])
    spec = scheduler.speculator
    assert spec.num_draft_tokens > 0
    assert spec.num_accepted_tokens == spec.num_draft_tokens


def test_greedy_outputs_on_the_bundled_trace_are_bit_identical(tiny_model):
    """The first 16 azure-conv requests, chunked prefill: the draft model changes no token."""
    outputs, schedulers = bundled_greedy_runs(tiny_model, (None, FIRST_LAYER))
    assert outputs[0] == outputs[1]
    assert schedulers[1].speculator.num_accepted_tokens > 0


def test_first_layers_share_the_targets_weights(tiny_model):
    drafter = first_layers_model(tiny_model, 1)
    assert len(drafter.layers) == 1 and drafter.layers[0] is tiny_model.layers[0]
    assert drafter.output is tiny_model.output
    with pytest.raises(ValueError, match="layers"):
        first_layers_model(tiny_model, 99)


def test_rejection_sampling_against_q_keeps_the_target_distribution():
    """Proposals drawn from a drafter's q (not the target's p), verified over many seeds:
    the first token's frequencies match p, and after an accepted proposal the next token's
    match the next position's p, within 5 standard errors."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.5, 0.0, -1.0],
                           [0.0, 1.0, 2.0, 0.0, -1.0, 0.5]])
    q = torch.tensor([0.05, 0.1, 0.4, 0.3, 0.1, 0.05])
    target = [torch.softmax(row / 0.8, dim=-1) for row in logits]
    n = 6000
    first, after_accept = torch.zeros(6), torch.zeros(6)
    draws = torch.multinomial(q, n, replacement=True, generator=torch.Generator().manual_seed(1))
    for seed in range(n):
        request = Request(f"s{seed}", 0.0, 2, 4, prompt_token_ids=[0, 1],
                          sampling=SamplingParams(seed=seed, temperature=0.8))
        draft = int(draws[seed])
        tokens = rejection_sample(logits, request, [draft], q[None])
        first[tokens[0]] += 1
        if len(tokens) == 2:
            after_accept[tokens[1]] += 1
    for counts, p in ((first, target[0]), (after_accept, target[1])):
        total = counts.sum()
        bound = 5 * torch.sqrt(p * (1 - p) / total) + 1e-3
        assert torch.all((counts / total - p).abs() < bound), (counts / total, p)


def test_sampled_rows_draft_and_still_complete(tiny_model):
    requests = workload()
    _, scheduler = run(tiny_model, requests, FIRST_LAYER, **POLICIES["recompute"])
    assert scheduler.speculator.num_drafts > 0
    scheduler.block_manager.check()


def test_eagle_and_mtp_are_refused_on_the_executor(tiny_model):
    scheduler = Scheduler(SchedulerConfig(block_size=16, max_model_len=MAX_MODEL_LEN))
    with pytest.raises(ValueError, match="simulation only"):
        build_drafter(SpeculativeConfig(method="eagle"), tiny_model, scheduler.block_manager)
