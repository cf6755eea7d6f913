"""The native row ops between a layer's GEMMs (executor/csrc/layers.cpp): RMSNorm with and
without the residual add, SiLU-and-multiply, RoPE with the KV write. Each against the torch
path's modules, each row alone bitwise the same row in a batch split over threads, and each
refusing inputs it cannot read."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from executor import native
from executor.kv_cache import write_kv
from executor.model import RMSNorm, apply_rope
from executor.weights import random_model
from tests.executor.helpers import TINY, Driver, make_request

pytestmark = pytest.mark.skipif(not native.enabled(),
                                reason="servelab's native CPU kernels are not available")
ops = torch.ops.servelab


def alone_and_batched(fn, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """fn(first, last) on every row alone on one thread, and on all rows on all threads."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = torch.cat([fn(r, r + 1) for r in range(rows)])
    finally:
        torch.set_num_threads(threads)
    return alone, fn(0, rows)


@pytest.mark.parametrize(("rows", "dim"), [(0, 512), (1, 512), (37, 512), (5, 100), (3, 7)])
def test_rms_norm_matches_the_torch_module(rows, dim):
    generator = torch.Generator().manual_seed(dim + rows)
    norm = RMSNorm(dim, 1e-5)
    norm.weight.data.normal_(generator=generator)
    x, residual = torch.randn(2, rows, dim, generator=generator) * 3
    torch.testing.assert_close(ops.rms_norm(x, norm.weight, 1e-5), norm(x), rtol=1e-5,
                               atol=1e-5)
    out, stream = ops.add_rms_norm(x, residual, norm.weight, 1e-5)
    expected, expected_stream = norm(x, residual)
    assert torch.equal(stream, expected_stream)  # one rounding either way: residual + x
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1408, 13, 1])
def test_silu_mul_matches_torch(n):
    generator = torch.Generator().manual_seed(n)
    gate_up = torch.randn(9, 2 * n, generator=generator) * 6
    gate_up[0, :min(n, 4)] = torch.tensor([0.0, -0.0, 95.0, -95.0])[:min(n, 4)]  # tails of exp
    gate, up = gate_up.split(n, dim=-1)
    torch.testing.assert_close(ops.silu_mul(gate_up), F.silu(gate) * up, rtol=2e-6, atol=1e-6)


def rope_inputs(rows: int, heads: int = 4, kv_heads: int = 2, dim: int = 24, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, (heads + 2 * kv_heads) * dim, generator=generator)
    angles = torch.rand(rows, dim // 2, generator=generator) * 50
    cache = torch.randn(2 * kv_heads, 8, 4, dim, generator=generator)  # 32 slots
    slots = torch.randperm(32, generator=generator)[:rows]
    return qkv, angles.cos(), angles.sin(), cache, slots


def test_rope_write_kv_matches_the_torch_path():
    heads, kv_heads, dim, rows, tokens = 4, 2, 24, 7, 5  # two padding rows at the end
    qkv, cos, sin, cache, slots = rope_inputs(rows, heads, kv_heads, dim)
    expected_cache = cache.clone()
    qk = apply_rope(qkv[:, :(heads + kv_heads) * dim].view(rows, heads + kv_heads, dim), cos, sin)
    v = qkv[:, (heads + kv_heads) * dim:].view(rows, kv_heads, dim)
    write_kv(expected_cache, qk[:tokens, heads:], v[:tokens], slots[:tokens])
    q = ops.rope_write_kv(qkv, cos, sin, cache, slots[:tokens], tokens, heads)
    torch.testing.assert_close(q[:tokens], qk[:tokens, :heads], rtol=1e-6, atol=1e-6)
    assert not q[tokens:].any()  # padding rows: zeros, as attention leaves them
    torch.testing.assert_close(cache, expected_cache, rtol=1e-6, atol=1e-6)
    untouched = torch.ones(32, dtype=torch.bool)
    untouched[slots[:tokens]] = False
    flat = cache.view(2 * kv_heads, 32, dim)
    expected_flat = expected_cache.view(2 * kv_heads, 32, dim)
    assert torch.equal(flat[:, untouched], expected_flat[:, untouched])
    assert torch.equal(flat[kv_heads:, ~untouched], expected_flat[kv_heads:, ~untouched])  # v


def test_every_row_op_gives_a_row_alone_the_bits_it_gets_in_a_batch():
    generator = torch.Generator().manual_seed(5)
    rows, dim = 300, 512  # past the 64-row grain: the batch is split between threads
    x, residual = torch.randn(2, rows, dim, generator=generator)
    weight = torch.randn(dim, generator=generator)
    gate_up = torch.randn(rows, 2 * 1408, generator=generator)
    for fn in (lambda a, b: ops.rms_norm(x[a:b], weight, 1e-5),
               lambda a, b: ops.add_rms_norm(x[a:b], residual[a:b], weight, 1e-5)[0],
               lambda a, b: ops.silu_mul(gate_up[a:b])):
        alone, batched = alone_and_batched(fn, rows)
        assert torch.equal(alone, batched)
    qkv, cos, sin, _, _ = rope_inputs(rows, heads=8, kv_heads=4, dim=64, seed=6)
    cache = torch.zeros(8, 32, 16, 64)  # 512 slots, one per row
    slots = torch.randperm(512, generator=generator)[:rows]
    alone, batched = alone_and_batched(
        lambda a, b: ops.rope_write_kv(qkv[a:b], cos[a:b], sin[a:b], cache, slots[a:b], b - a,
                                       8), rows)
    assert torch.equal(alone, batched)


def test_row_ops_refuse_inputs_they_cannot_read():
    x = torch.randn(3, 16)
    with pytest.raises(RuntimeError, match="float32"):
        ops.rms_norm(x.double(), torch.ones(16), 1e-5)
    with pytest.raises(RuntimeError, match="contiguous"):
        ops.rms_norm(x.t(), torch.ones(3), 1e-5)
    with pytest.raises(RuntimeError, match="16 values"):
        ops.rms_norm(x, torch.ones(15), 1e-5)
    with pytest.raises(RuntimeError, match="3 rows, residual 2"):
        ops.add_rms_norm(x, x[:2], torch.ones(16), 1e-5)
    with pytest.raises(RuntimeError, match="even number"):
        ops.silu_mul(torch.randn(2, 7))
    qkv, cos, sin, cache, slots = rope_inputs(4)
    with pytest.raises(RuntimeError, match="writes slot 32 of a 32-slot cache"):
        ops.rope_write_kv(qkv, cos, sin, cache, torch.tensor([0, 1, 2, 32]), 4, 4)
    with pytest.raises(RuntimeError, match="qkv has 192 columns, expected 120"):
        ops.rope_write_kv(qkv, cos, sin, cache, slots, 4, 1)
    with pytest.raises(RuntimeError, match="cos and sin need 4 rows"):
        ops.rope_write_kv(qkv, cos[:3], sin[:3], cache, slots, 4, 4)


def test_a_model_gives_the_same_tokens_with_its_row_ops_native_or_in_torch():
    model = random_model(TINY, seed=0)
    assert model.native
    logits = []
    for on in (True, False):
        model.use_row_ops(on)
        driver, request = Driver(model), make_request("a", 40, 3)
        # the second chunk reads the KV the first one wrote
        logits.append(torch.cat([driver.step([(request, 30)]), driver.step([(request, 10)])]))
    model.use_row_ops(True)
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-4, atol=1e-4)
    assert torch.equal(logits[0].argmax(-1), logits[1].argmax(-1))
