"""servelab's native CPU kernels (executor/csrc/) on every instruction set the CPU runs: against
plain torch references, batch invariance of each kernel within each ISA, the SERVELAB_ISA
override, their input checks, and the fallback to the torch path when they are off or fail to
build. The model-level batch-invariance tests run the default ISA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from executor import native
from executor.linear import Linear

needs_native = pytest.mark.skipif(not native.enabled(),
                                  reason="servelab's native CPU kernels are not available")
CPU_ISAS = list(torch.ops.servelab.cpu_isas()) if native.enabled() else []


@pytest.fixture(params=native.ISAS)
def isa(request, monkeypatch):
    """Run the test with the kernels on one ISA (SERVELAB_ISA); skipped where the CPU lacks it."""
    if request.param not in CPU_ISAS:
        pytest.skip(f"no native kernels for {request.param} on this machine")
    monkeypatch.setenv(native.ISA_ENV, request.param)
    assert native.isa() == request.param
    yield request.param
    monkeypatch.undo()
    native.kernels()  # back to the ISA the environment asks for


@pytest.mark.parametrize(("rows", "in_features", "out_features"),
                         [(1, 512, 2816), (7, 64, 37), (13, 1408, 512), (150, 300, 176),
                          (0, 64, 16), (3, 1, 20)])
def test_linear_matches_torch(isa, rows, in_features, out_features):
    generator = torch.Generator().manual_seed(rows)
    weight = torch.randn(out_features, in_features, generator=generator)
    bias = torch.randn(out_features, generator=generator)
    x = torch.randn(rows, in_features, generator=generator)
    panels = torch.ops.servelab.pack_weight(weight)
    for b in (None, bias):
        ours = torch.ops.servelab.linear(x, panels, b, out_features)
        torch.testing.assert_close(ours, F.linear(x, weight, b), rtol=1e-5, atol=1e-4)


def test_linear_row_alone_is_bitwise_the_row_in_any_batch(isa):
    # K = 300 and 1408 block the reduction (KC: 256 or 512); N = 200 ends in a partial
    # panel; 300 rows > MC.
    generator = torch.Generator().manual_seed(1)
    for in_features, out_features in [(300, 200), (1408, 64)]:
        weight = torch.randn(out_features, in_features, generator=generator)
        bias = torch.randn(out_features, generator=generator)
        x = torch.randn(300, in_features, generator=generator)
        panels = torch.ops.servelab.pack_weight(weight)
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # alone on one thread; batches on all of them
        try:
            alone = torch.cat([torch.ops.servelab.linear(x[i:i + 1], panels, bias, out_features)
                               for i in range(len(x))])
        finally:
            torch.set_num_threads(threads)
        for rows in (2, 5, 6, 7, 12, 13, 40, 145, 300):
            for start in {0, (len(x) - rows) // 2, len(x) - rows}:
                batch = torch.ops.servelab.linear(x[start:start + rows], panels, bias,
                                                  out_features)
                assert torch.equal(batch, alone[start:start + rows]), (rows, start)


def test_linear_gives_the_same_bits_on_every_isa(monkeypatch):
    if len(CPU_ISAS) < 2:
        pytest.skip("needs the native kernels on two ISAs")
    generator = torch.Generator().manual_seed(2)
    weight, x = torch.randn(200, 300, generator=generator), torch.randn(9, 300, generator=generator)
    outputs = []
    for name in CPU_ISAS:
        monkeypatch.setenv(native.ISA_ENV, name)
        panels = native.kernels().pack_weight(weight)
        outputs.append(torch.ops.servelab.linear(x, panels, None, 200))
    monkeypatch.undo()
    native.kernels()
    assert all(torch.equal(out, outputs[0]) for out in outputs)


@needs_native
def test_linear_refuses_mismatched_inputs():
    panels = torch.ops.servelab.pack_weight(torch.randn(40, 64))
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.servelab.linear(torch.randn(2, 64, dtype=torch.float64), panels, None, 40)
    with pytest.raises(RuntimeError, match="does not fit"):
        torch.ops.servelab.linear(torch.randn(2, 65), panels, None, 40)
    with pytest.raises(RuntimeError, match="packed panels"):
        torch.ops.servelab.linear(torch.randn(2, 64), panels, None, 100)
    with pytest.raises(RuntimeError, match="panels are 8 wide"):
        torch.ops.servelab.linear(torch.randn(2, 64), torch.zeros(1, 64, 8), None, 8)


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


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block_size", "window"),
                         [(8, 4, 64, 16, 0), (4, 4, 8, 1, 0), (4, 1, 128, 16, 0),
                          (2, 2, 24, 4, 5), (6, 1, 32, 16, 0)])
def test_paged_attention_matches_torch(isa, heads, kv_heads, dim, block_size, window):
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


@pytest.mark.parametrize(("heads", "kv_heads", "dim", "block_size", "window"),
                         [(8, 4, 64, 16, 0), (2, 1, 24, 4, 5)])
def test_paged_attention_row_alone_is_bitwise_the_row_in_any_batch(isa, heads, kv_heads, dim,
                                                                   block_size, window):
    generator = torch.Generator().manual_seed(3)
    lengths, num_blocks = [1, 17, 40, 70], 128
    cache = torch.randn(2 * kv_heads, num_blocks, block_size, dim, generator=generator)
    width = max(-(-n // block_size) for n in lengths)
    tables = torch.randperm(num_blocks, generator=generator)[:len(lengths) * width]
    tables = tables.view(len(lengths), width)
    # Every (sequence, position) row once.
    row_seq = torch.tensor([s for s, n in enumerate(lengths) for _ in range(n)])
    positions = torch.cat([torch.arange(n) for n in lengths])
    qk = torch.randn(len(row_seq), heads + kv_heads, dim, generator=generator)

    def attend(rows: torch.Tensor, padding: int = 0) -> torch.Tensor:
        """rows in this order, then `padding` linear-layer padding rows; q strided as in the
        model."""
        q = torch.cat([qk[rows], qk[rows[:padding]]])[:, :heads]
        pad = torch.zeros(padding, dtype=torch.long)
        return torch.ops.servelab.paged_attention(
            q, cache, tables, row_seq[rows], torch.cat([positions[rows], pad]), len(rows),
            dim ** -0.5, window)[:len(rows)]

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        alone = torch.cat([attend(torch.tensor([t])) for t in range(len(row_seq))])
    finally:
        torch.set_num_threads(threads)
    for rows, padding in [(3, 0), (8, 1), (33, 3), (len(row_seq), 0)]:
        batch = torch.randperm(len(row_seq), generator=generator)[:rows]
        assert torch.equal(attend(batch, padding), alone[batch]), rows
    prefill = torch.arange(lengths[0] + lengths[1], sum(lengths[:3]))  # sequence 2's prompt
    assert torch.equal(attend(prefill), alone[prefill])


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

    monkeypatch.delenv(native.ENV, raising=False)
    monkeypatch.setattr(native, "_build", broken)
    monkeypatch.setattr(native, "cpu_supported", lambda: True)
    monkeypatch.setitem(native._state, "tried", False)
    monkeypatch.setitem(native._state, "loaded", None)
    with pytest.warns(UserWarning, match="no compiler"):
        assert native.kernels() is None
    assert native.kernels() is None  # tried once; no second warning, no second build


def test_environment_variable_picks_the_isa(isa):
    layer = Linear(64, 200)
    layer.weight.data.normal_()
    layer.pack()
    assert torch.ops.servelab.isa() == isa
    assert layer._panels.shape[2] == (64 if isa == "avx512" else 16)  # packed for that ISA
    with torch.inference_mode():
        x = torch.randn(3, 64)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight), rtol=1e-5, atol=1e-4)


def test_an_unknown_isa_is_an_error(monkeypatch):
    monkeypatch.delenv(native.ENV, raising=False)
    monkeypatch.setenv(native.ISA_ENV, "avx1024")
    with pytest.raises(ValueError, match="SERVELAB_ISA='avx1024' is not an instruction set"):
        native.kernels()
    monkeypatch.undo()
    native.kernels()


@needs_native
def test_the_set_isa_op_refuses_unknown_names():
    with pytest.raises(RuntimeError, match="unknown ISA 'sse4'"):
        torch.ops.servelab.set_isa("sse4")
