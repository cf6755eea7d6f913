"""KV-cache equivalence: computing a sequence in pieces through the paged cache gives the
logits of one full prefill, for one sequence, a ragged mixed batch and a chunked prompt."""

from __future__ import annotations

import pytest
import torch

from sim.engine.block_manager import BlockManager
from sim.engine.core import Request
from tests.executor.helpers import Driver, make_request

ATOL = 1e-5  # float32; in practice the paths agree bit for bit (see test_batch_numerics.py)


def full_prefill(model, request_id: str, length: int) -> torch.Tensor:
    """Logits [length, vocab] of one prefill of the whole prompt, alone in a fresh cache."""
    driver = Driver(model)
    request = make_request(request_id, length)
    return driver.step([(request, length)])


@pytest.mark.parametrize("block_size", [16, 4, 1])
def test_prefill_then_decode_matches_full_prefill(tiny_model, block_size):
    n = 37
    reference = full_prefill(tiny_model, "a", n)
    driver = Driver(tiny_model, num_blocks=64 * 16 // block_size, block_size=block_size)
    request = make_request("a", n)
    first = driver.step([(request, n - 1)])
    last = driver.step([(request, 1)])
    torch.testing.assert_close(first, reference[: n - 1], atol=ATOL, rtol=0)
    torch.testing.assert_close(last[0], reference[n - 1], atol=ATOL, rtol=0)


def test_ragged_batch_with_decodes_matches_each_full_prefill(tiny_model):
    lengths = {"a": 5, "b": 17, "c": 33, "d": 50, "e": 2}
    references = {rid: full_prefill(tiny_model, rid, n) for rid, n in lengths.items()}
    driver = Driver(tiny_model, num_blocks=128)
    req = {rid: make_request(rid, n) for rid, n in lengths.items()}
    # Step 1: a, b, c prefill all but their last token, together.
    step1 = driver.step([(req["a"], 4), (req["b"], 16), (req["c"], 32)])
    # Step 2, mixed: a and b decode, d prefills everything but its last token, e prefills whole.
    step2 = driver.step([(req["a"], 1), (req["d"], 49), (req["b"], 1), (req["e"], 2)])
    # Step 3: c and d decode.
    step3 = driver.step([(req["c"], 1), (req["d"], 1)])
    torch.testing.assert_close(step1[:4], references["a"][:4], atol=ATOL, rtol=0)
    torch.testing.assert_close(step1[4:20], references["b"][:16], atol=ATOL, rtol=0)
    torch.testing.assert_close(step1[20:], references["c"][:32], atol=ATOL, rtol=0)
    torch.testing.assert_close(step2[0], references["a"][4], atol=ATOL, rtol=0)
    torch.testing.assert_close(step2[1:50], references["d"][:49], atol=ATOL, rtol=0)
    torch.testing.assert_close(step2[50], references["b"][16], atol=ATOL, rtol=0)
    torch.testing.assert_close(step2[51:], references["e"], atol=ATOL, rtol=0)
    torch.testing.assert_close(step3[0], references["c"][32], atol=ATOL, rtol=0)
    torch.testing.assert_close(step3[1], references["d"][49], atol=ATOL, rtol=0)


def test_prompt_prefilled_in_chunks_matches_full_prefill(tiny_model):
    n = 150  # crosses the 128-key chunk of the P @ V matmul
    reference = full_prefill(tiny_model, "a", n)
    driver = Driver(tiny_model)
    request = make_request("a", n)
    pieces = [driver.step([(request, size)]) for size in (16, 16, 1, 47, 70)]
    torch.testing.assert_close(torch.cat(pieces), reference, atol=ATOL, rtol=0)


def test_only_logit_rows_are_computed(tiny_model):
    driver = Driver(tiny_model)
    a, b = make_request("a", 10), make_request("b", 6)
    logits = driver.step([(a, 4), (b, 6)], all_logits=False)  # a stops mid-prompt
    assert logits.shape == (1, tiny_model.args.vocab_size)
    torch.testing.assert_close(logits[0], full_prefill(tiny_model, "b", 6)[-1], atol=ATOL, rtol=0)
    assert driver.step([(a, 3)], all_logits=False).shape == (0, tiny_model.args.vocab_size)


def test_suffix_over_a_cached_prefix_matches_full_prefill_bit_for_bit(tiny_model):
    driver = Driver(tiny_model, num_blocks=64)
    bm = driver.block_manager = BlockManager(64, 16, enable_caching=True)
    first = make_request("a", 64)
    driver.step([(first, 64)])
    bm.cache_blocks(first, 64)
    tokens = first.prompt_token_ids[:48] + make_request("b", 20).prompt_token_ids
    second = Request("b", 0.0, len(tokens), 4, prompt_token_ids=tokens)
    prefix = bm.cached_prefix(second)
    assert len(prefix) == 3 and bm.try_allocate("b", len(tokens), prefix)
    second.num_computed_tokens = 48
    suffix = driver.step([(second, 20)])
    reference = Driver(tiny_model).step([(Request("b", 0.0, len(tokens), 4,
                                                  prompt_token_ids=tokens), len(tokens))])
    assert torch.equal(suffix, reference[48:])
