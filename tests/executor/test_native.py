"""servelab's native CPU kernels (executor/csrc/kernels.cpp) against plain torch references,
their input checks, and the fallback to the torch path when they are off or fail to build."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from executor import native
from executor.linear import Linear

needs_native = pytest.mark.skipif(not native.enabled(),
                                  reason="servelab's native CPU kernels are not available")


@needs_native
@pytest.mark.parametrize(("rows", "in_features", "out_features"),
                         [(1, 512, 2816), (7, 64, 37), (13, 1408, 512), (150, 300, 176),
                          (0, 64, 16), (3, 1, 20)])
def test_linear_matches_torch(rows, in_features, out_features):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    x = torch.randn(rows, in_features, generator=generator)
    panels = torch.ops.servelab.pack_weight(weight)
    for b in (None, bias):
        ours = torch.ops.servelab.linear(x, panels, b, out_features)
        torch.testing.assert_close(ours, F.linear(x, weight, b), rtol=1e-5, atol=1e-4)


@needs_native
def test_linear_refuses_mismatched_inputs():
    panels = torch.ops.servelab.pack_weight(torch.randn(40, 64))
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.servelab.linear(torch.randn(2, 64, dtype=torch.float64), panels, None, 40)
    with pytest.raises(RuntimeError, match="does not fit"):
        torch.ops.servelab.linear(torch.randn(2, 65), panels, None, 40)
    with pytest.raises(RuntimeError, match="packed panels"):
        torch.ops.servelab.linear(torch.randn(2, 64), panels, None, 60)


def reference_attention(q, cache, tables, row_seq, positions, scale, window):
    """Softmax attention of each row over its sequence's keys 0..position (or the window)."""
    heads, dim = q.shape[1], q.shape[2]
    kv_heads, block_size = cache.shape[0] // 2, cache.shape[2]
    out = torch.zeros(q.shape[0], heads * dim)
    for t in range(len(row_seq)):
        pos = int(positions[t])
        keys = torch.arange(max(0, pos - window + 1) if window else 0, pos + 1)
        blocks = tables[row_seq[t], keys // block_size]
        k = cache[:kv_heads, blocks, keys % block_size]  # [Hkv, n, D]
        v = cache[kv_heads:, blocks, keys % block_size]
        group = heads // kv_heads
        qt = q[t].view(kv_heads, group, dim)
        probs = torch.softmax(qt @ k.transpose(1, 2) * scale, dim=-1)  # [Hkv, G, n]
        out[t] = (probs @ v).reshape(-1)
    return out


@needs_native
@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block_size", "window"),
                         [(8, 4, 64, 16, 0), (4, 4, 8, 1, 0), (4, 1, 128, 16, 0),
                          (2, 2, 24, 4, 5)])
def test_paged_attention_matches_torch(heads, kv_heads, dim, block_size, window):
    generator = torch.Generator().manual_seed(dim)
    num_blocks, lengths = 256, [1, 9, 40, 33]
    cache = torch.randn(2 * kv_heads, num_blocks, block_size, dim, generator=generator)
    width = max(-(-n // block_size) for n in lengths) + 1
    tables = torch.randperm(num_blocks, generator=generator)[:len(lengths) * width]
    tables = tables.view(len(lengths), width)
    # Rows: a whole prompt of sequence 0, a chunk of sequence 2, decodes of 1 and 3.
    row_seq = torch.tensor([0, 2, 2, 2, 1, 3])
    positions = torch.tensor([0, 37, 38, 39, 8, 32, 0, 0])  # two padding rows at the end
    qk = torch.randn(8, heads + kv_heads, dim, generator=generator)  # strided q, as the model
    q = qk[:, :heads]
    scale = dim ** -0.5
    ours = torch.ops.servelab.paged_attention(q, cache, tables, row_seq, positions, 6, scale,
                                              window)
    expected = reference_attention(q, cache, tables, row_seq, positions, scale, window)
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-5)
    assert not ours[6:].any()  # padding rows come out as zeros


@needs_native
def test_paged_attention_refuses_rows_outside_their_tables():
    cache = torch.zeros(2, 4, 16, 8)
    q = torch.zeros(1, 1, 8)
    tables = torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(RuntimeError, match="outside its block table"):
        torch.ops.servelab.paged_attention(q, cache, tables, torch.tensor([0]),
                                           torch.tensor([32]), 1, 1.0, 0)
    with pytest.raises(RuntimeError, match="no block table"):
        torch.ops.servelab.paged_attention(q, cache, tables, torch.tensor([3]),
                                           torch.tensor([0]), 1, 1.0, 0)
    with pytest.raises(RuntimeError, match="reads block 9 of a 4-block cache"):
        torch.ops.servelab.paged_attention(q, cache, torch.tensor([[1, 9]]), torch.tensor([0]),
                                           torch.tensor([20]), 1, 1.0, 0)
    with pytest.raises(RuntimeError, match="multiple of 8"):
        torch.ops.servelab.paged_attention(torch.zeros(1, 1, 6), torch.zeros(2, 4, 16, 6),
                                           tables, torch.tensor([0]), torch.tensor([0]), 1,
                                           1.0, 0)


def test_environment_variable_selects_the_torch_path(monkeypatch):
    monkeypatch.setenv(native.ENV, "0")
    assert native.kernels() is None
    layer = Linear(16, 8)
    layer.weight.data.normal_()
    layer.pack()
    assert not layer.is_native
    with torch.inference_mode():
        torch.testing.assert_close(layer(torch.ones(2, 16)), F.linear(torch.ones(2, 16),
                                                                      layer.weight))


def test_a_failed_build_warns_once_and_falls_back(monkeypatch):
    def broken():
        raise RuntimeError("no compiler")

    monkeypatch.setattr(native, "_build", broken)
    monkeypatch.setattr(native, "cpu_supported", lambda: True)
    monkeypatch.setitem(native._state, "tried", False)
    monkeypatch.setitem(native._state, "loaded", None)
    with pytest.warns(UserWarning, match="no compiler"):
        assert native.kernels() is None
    assert native.kernels() is None  # tried once; no second warning, no second build
