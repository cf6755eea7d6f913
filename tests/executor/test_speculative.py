"""Speculative decoding on the real model: greedy outputs are bit-identical with and without
n-gram proposals, under every iteration-level policy, preemption included."""

from __future__ import annotations

import pytest

from sim.engine.speculation.config import SpeculativeConfig
from tests.executor.test_batch_invariance import POLICIES, run, workload

NGRAM = SpeculativeConfig(num_speculative_tokens=3, prompt_lookup_min=1, prompt_lookup_max=3)


@pytest.fixture(scope="module")
def outputs_plain(tiny_model) -> dict[str, list[int]]:
    return run(tiny_model, workload(), **POLICIES["continuous"])[0]


@pytest.mark.parametrize("name", ["continuous", "recompute", "chunked"])
def test_speculative_outputs_are_bit_identical_to_plain_decoding(tiny_model, outputs_plain,
                                                                 name):
    outputs, scheduler = run(tiny_model, workload(), speculative=NGRAM, **POLICIES[name])
    mismatched = [rid for rid in outputs_plain if outputs[rid] != outputs_plain[rid]]
    assert not mismatched, f"{name}: speculation changed the outputs of {mismatched}"
    spec = scheduler.speculator
    assert spec.num_drafts > 0 and spec.num_accepted_tokens > 0  # verification really ran
    scheduler.block_manager.check()
    assert scheduler.block_manager.num_used_blocks == 0
