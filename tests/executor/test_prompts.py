"""Synthetic prompt tokens: deterministic, in range, shared exactly where hash ids match."""

from __future__ import annotations

import pytest

from executor.prompts import attach_prompt_tokens, stable_seed, synth_prompt_tokens
from sim.engine.core import Request


def test_tokens_are_deterministic_in_range_and_keyed():
    a = synth_prompt_tokens("req-1", 300, 320)
    assert a == synth_prompt_tokens("req-1", 300, 320)
    assert a != synth_prompt_tokens("req-2", 300, 320)
    assert synth_prompt_tokens(5, 300, 320) == synth_prompt_tokens(5, 300, 320)
    assert len(a) == 300 and min(a) >= 3 and max(a) < 320
    assert stable_seed("req-1") == stable_seed("req-1") != stable_seed("req-2")


def test_equal_hash_ids_give_equal_blocks():
    block = 4
    a = synth_prompt_tokens("a", 10, 1000, prefix_hash_ids=[7, 8, 9], hash_block_tokens=block)
    b = synth_prompt_tokens("b", 12, 1000, prefix_hash_ids=[7, 8, 5], hash_block_tokens=block)
    c = synth_prompt_tokens("c", 10, 1000, prefix_hash_ids=[1, 8], hash_block_tokens=block)
    assert a[:8] == b[:8]  # blocks 7, 8 shared
    assert a[8:10] != b[8:10]  # block 9 vs 5
    assert a[4:8] == c[4:8] and a[:4] != c[:4]  # block i depends on its own id only
    assert c[8:] == synth_prompt_tokens("c", 2, 1000)  # past the hashes: the request's own
    # A shorter prompt takes a prefix of the last hash block.
    assert synth_prompt_tokens("x", 6, 1000, [7, 8], block) == a[:6]


def test_attach_fills_only_missing_prompts():
    given = Request("g", 0.0, 3, 1, prompt_token_ids=[5, 6, 7])
    empty = Request("e", 0.0, 5, 1)
    attach_prompt_tokens([given, empty], vocab_size=320, seed=1)
    assert given.prompt_token_ids == [5, 6, 7]
    assert empty.prompt_token_ids == synth_prompt_tokens("1:e", 5, 320)


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="prompt_len"):
        synth_prompt_tokens("a", -1, 320)
    with pytest.raises(ValueError, match="vocab_size"):
        synth_prompt_tokens("a", 3, 0)


def test_token_granular_prefixes_share_exactly_their_stated_tokens():
    from executor.prompts import synth_prompt_tokens

    a = synth_prompt_tokens("a", 547, 1000, [7, 8], prefix_hash_tokens=[100, 447])
    b = synth_prompt_tokens("b", 547, 1000, [7, 9], prefix_hash_tokens=[100, 447])
    cut = synth_prompt_tokens("c", 60, 1000, [7], prefix_hash_tokens=[100])
    assert a[:100] == b[:100] and a[100:] != b[100:]
    assert cut == a[:60]
