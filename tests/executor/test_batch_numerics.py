"""Bit-exact batch invariance of the forward: a row's logits never depend on what else is in
the step (row counts, padding, other sequences' lengths, how its prompt was chunked).

These are the kernel-level guarantees behind test_batch_invariance.py, on both kernel paths
(conftest.kernel_path): if a BLAS update breaks one of the torch path's padding rules in
executor/attention.py or linear.py, or a change to csrc/kernels.cpp makes a row's arithmetic
depend on its neighbours, these fail first.
"""

from __future__ import annotations

import pytest
import torch

from executor.linear import Linear
from tests.executor.helpers import Driver, make_request


@pytest.mark.parametrize(("in_features", "out_features"),
                         [(64, 176), (512, 1408), (1408, 512), (300, 37)])
def test_packed_linear_row_does_not_depend_on_row_count(in_features, out_features, kernel_path):
    generator = torch.Generator().manual_seed(0)
    layer = Linear(in_features, out_features)
    layer.weight.data.normal_(0, 0.02, generator=generator)
    with kernel_path():
        layer.pack()
    x = torch.randn(300, in_features, generator=generator)
    with torch.inference_mode():
        full = layer(x)
        for rows in (1, 2, 3, 4, 5, 7, 8, 12, 13, 16, 33, 100, 145, 200):
            for first in (0, 57):
                assert torch.equal(layer(x[first:first + rows]), full[first:first + rows]), rows


def alone(model, request_id: str, length: int, block_size: int) -> torch.Tensor:
    """Logits of prefill(length - 1) then decode(1), with nothing else in either step."""
    driver = Driver(model, num_blocks=4096 // block_size, block_size=block_size)
    request = make_request(request_id, length)
    return torch.cat([driver.step([(request, length - 1)]), driver.step([(request, 1)])])


@pytest.mark.parametrize("block_size", [16, 1])
def test_logits_do_not_depend_on_the_rest_of_the_batch(tiny_model, block_size):
    lengths = {"a": 3, "b": 40, "c": 130, "d": 300, "e": 9}
    references = {rid: alone(tiny_model, rid, n, block_size) for rid, n in lengths.items()}
    driver = Driver(tiny_model, num_blocks=4096 // block_size, block_size=block_size)
    req = {rid: make_request(rid, n) for rid, n in lengths.items()}
    # Prefills of very different lengths share a step; decodes share one with a long prefill.
    step1 = driver.step([(req["a"], 2), (req["b"], 39), (req["c"], 129)])
    step2 = driver.step([(req["b"], 1), (req["d"], 299), (req["a"], 1), (req["e"], 8)])
    step3 = driver.step([(req["e"], 1), (req["c"], 1), (req["d"], 1)])
    assert torch.equal(step1[:2], references["a"][:2])
    assert torch.equal(step1[2:41], references["b"][:39])
    assert torch.equal(step1[41:], references["c"][:129])
    assert torch.equal(step2[0], references["b"][39])
    assert torch.equal(step2[1:300], references["d"][:299])
    assert torch.equal(step2[300], references["a"][2])
    assert torch.equal(step2[301:], references["e"][:8])
    assert torch.equal(step3[0], references["e"][8])
    assert torch.equal(step3[1], references["c"][129])
    assert torch.equal(step3[2], references["d"][299])


def test_chunked_prefill_is_bit_exact(tiny_model):
    n = 200
    reference = torch.cat([Driver(tiny_model).step([(make_request("a", n), n)])])
    driver = Driver(tiny_model)
    request = make_request("a", n)
    # One-token chunks run as decode rows; all others as prefill rows of various row counts.
    pieces = [driver.step([(request, size)]) for size in (2, 1, 3, 16, 1, 49, 128)]
    assert torch.equal(torch.cat(pieces), reference)


def test_logits_do_not_depend_on_the_thread_count(tiny_model):
    before = torch.get_num_threads()
    results = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            driver = Driver(tiny_model)
            a, b = make_request("a", 150), make_request("b", 8)
            first = driver.step([(a, 149), (b, 7)])
            results.append(torch.cat([first, driver.step([(a, 1), (b, 1)])]))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(results[0], results[1])


def test_prefill_steps_pad_rows_for_the_linears_only(tiny_model):
    from executor.batch import PREFILL_ROW_MULTIPLE, Segment, build_step_inputs

    driver = Driver(tiny_model)
    a, b = make_request("a", 5), make_request("b", 40)
    driver.step([(b, 39)])
    for request, n in ((a, 5), (b, 1)):
        driver.block_manager.allocate(request.request_id, request.num_computed_tokens + n)
    segments = [Segment(a, 0, 5, True), Segment(b, 39, 1, True)]
    inputs = build_step_inputs(segments, driver.block_manager, tiny_model.args,
                               torch.device("cpu"))
    assert inputs.num_tokens == 6 and len(inputs.slots) == 6  # only real rows write KV
    assert len(inputs.token_ids) == PREFILL_ROW_MULTIPLE  # the linears see a padded count
    decode_only = build_step_inputs([Segment(b, 39, 1, True)], driver.block_manager,
                                    tiny_model.args, torch.device("cpu"))
    assert len(decode_only.token_ids) == 1  # decode batch sizes repeat: no padding
