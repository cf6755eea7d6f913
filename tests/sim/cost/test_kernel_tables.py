"""Measured-kernel tables: interpolation, units, dispatch, and the step pricer built on them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from sim.cost.engine_overhead import load_engine
from sim.cost.gpu_shapes import LayerShapes, known_gpu
from sim.cost.kernel_cost import KernelCostModel, gemm_quant
from sim.cost.kernel_curves import Curve, Grid, blend, bracket, graph_replayed_block
from sim.cost.kernel_tables import (
    DATA_DIR,
    KernelTableError,
    KernelTables,
)
from sim.engine.core import BatchPlan

EXTRACT = DATA_DIR / "extract.py"


def _extract_module():
    spec = importlib.util.spec_from_file_location("aic_extract", EXTRACT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- curves ----------------------------------------------------------------------------


def test_curve_is_exact_at_measured_points_and_monotone_between():
    xs, ys = [1, 16, 17, 256, 4096], [0.01, 0.012, 0.02, 0.05, 0.9]
    curve = Curve(xs, ys)
    assert [curve(x) for x in xs] == ys
    for i in range(len(xs) - 1):
        (x0, y0), (x1, y1) = (xs[i], ys[i]), (xs[i + 1], ys[i + 1])
        between = [curve(x) for x in np.linspace(x0, x1, 50)]
        assert all(between[j] <= between[j + 1] for j in range(len(between) - 1))
        assert y0 <= min(between) and max(between) <= y1


def test_curve_holds_below_and_grows_with_the_work_above():
    curve = Curve([2, 8], [1.0, 4.0], power=2.0)
    assert curve(1) == 1.0  # never cheaper than the smallest measured launch
    assert curve(16) == pytest.approx(4.0 * 4)  # causal prefill: work ~ length^2
    assert Curve([2, 8], [1.0, 4.0])(16) == pytest.approx(8.0)  # linear in the work


def test_curve_many_matches_scalar_calls():
    curve = Curve([1, 10, 100], [1.0, 3.0, 20.0])
    xs = np.array([0.5, 1, 5, 10, 50, 100, 400])
    assert curve.many(xs) == pytest.approx([curve(x) for x in xs], rel=1e-12)


def test_blend_between_two_shapes_lies_between_them_and_is_exact_at_each():
    lo, hi = Curve([1, 100], [1.0, 10.0]), Curve([1, 50, 100], [2.0, 8.0, 30.0])
    points, scale = bracket([1024, 4096], 2048)
    mid = blend(((lo if n == 1024 else hi, w) for n, w in points), scale)
    for m in (1, 50, 100):
        assert lo(m) < mid(m) < hi(m)
    points, scale = bracket([1024, 4096], 4096)
    assert points == [(4096, 1.0)] and scale == 1.0
    assert bracket([1024, 4096], 8192) == ([(4096, 1.0)], 2.0)  # beyond: FLOPs scaling


def test_grid_blends_batches_and_scales_past_the_largest():
    grid = Grid({1: Curve([1, 100], [1.0, 2.0]), 4: Curve([1, 100], [4.0, 8.0])})
    assert grid(1, 100) == 2.0 and grid(4, 1) == 4.0
    assert 1.0 < grid(2, 1) < 4.0
    assert grid(8, 100) == pytest.approx(16.0)


# ---- extraction units --------------------------------------------------------------------


def test_all_reduce_tables_count_elements_and_are_stored_in_bytes():
    extract = _extract_module()
    custom = pd.DataFrame({"op_name": ["all_reduce"] * 2, "backend": ["vllm_graph", "vllm_eager"],
                           "allreduce_dtype": ["bfloat16"] * 2, "num_gpus": [2, 2],
                           "message_size": [1024, 1024], "latency": [0.004, 0.02]})
    out = extract._custom_all_reduce(custom)
    assert out["message_bytes"].tolist() == [2048] and out["latency_ms"].tolist() == [0.004]
    nccl = pd.DataFrame({"op_name": ["all_reduce", "all_reduce", "all_gather"],
                         "nccl_dtype": ["half", "int8", "half"], "num_gpus": [4, 4, 4],
                         "message_size": [4096, 4096, 4096], "latency": [0.01, 0.009, 0.02]})
    out = extract._nccl(nccl, "all_reduce")
    assert out["message_bytes"].tolist() == [8192] and out["latency_ms"].tolist() == [0.01]
    out = extract._nccl(nccl, "all_gather")
    assert out["message_bytes"].tolist() == [8192] and out["latency_ms"].tolist() == [0.02]


def test_generation_attention_kv_length_is_isl_plus_step():
    extract = _extract_module()
    frame = pd.DataFrame({"batch_size": [8], "isl": [1], "step": [1023], "num_heads": [32],
                          "num_key_value_heads": [8], "head_dim": [128], "latency": [0.02],
                          "attn_dtype": ["bfloat16"], "kv_cache_dtype": ["bfloat16"],
                          "kernel_source": ["fa3"]})
    out, kernels = extract._generation_attention(frame)
    assert out["kv_len"].tolist() == [1024] and kernels == {"auto": "fa3"}
    assert out["kv"].tolist() == ["auto"]


def test_attention_rows_keep_16_bit_and_fp8_kv_apart_each_with_its_kernel():
    """A 16-bit row (auto), fp8-KV rows of the most measured fp8 kernel, nothing else."""
    extract = _extract_module()
    frame = pd.DataFrame({"batch_size": [8, 8, 16, 8, 8], "isl": [1] * 5, "step": [1023] * 5,
                          "num_heads": [32] * 5, "num_key_value_heads": [8] * 5,
                          "head_dim": [128] * 5, "latency": [0.02, 0.01, 0.04, 0.05, 0.03],
                          "attn_dtype": ["bfloat16"] * 5,
                          "kv_cache_dtype": ["bfloat16", "fp8", "fp8", "fp8", "float16"],
                          "kernel_source": ["fa3", "fi", "fi", "triton", "fa3"]})
    out, kernels = extract._generation_attention(frame)
    assert kernels == {"auto": "fa3", "fp8": "fi"}
    assert sorted(zip(out["kv"], out["batch"], out["latency_ms"], strict=True)) == [
        ("auto", 8, 0.02), ("fp8", 8, 0.01), ("fp8", 16, 0.04)]


def test_moe_rows_keep_the_balanced_and_power_law_routings_apart():
    extract = _extract_module()
    frame = pd.DataFrame({"distribution": ["balanced", "power_law_1.2", "power_law_1.01"],
                          "moe_dtype": ["fp8"] * 3, "num_tokens": [32] * 3,
                          "hidden_size": [3072] * 3, "inter_size": [1536] * 3,
                          "num_experts": [256] * 3, "topk": [8] * 3, "moe_tp_size": [1] * 3,
                          "moe_ep_size": [4] * 3, "latency": [0.35, 0.2, 0.21]})
    out = extract._moe(frame)
    assert sorted(zip(out["routing"], out["latency_ms"], strict=True)) == [
        ("balanced", 0.35), ("power_law_1.2", 0.2)]


def test_moe_layer_is_the_faster_routing_at_each_token_count():
    """Small batches: the power law's few experts; large ones: the even spread."""
    tables = KernelTables.load("h100", "0.19.0")
    shape = dict(quant="fp8", hidden=3072, inter=1536, experts=256, topk=8, tp=1, ep=4)
    curve = tables.moe(**shape)
    frame = pd.read_parquet(DATA_DIR / "h100" / "moe.parquet")
    rows = frame[(frame["source_version"] == "0.19.0")
                 & np.logical_and.reduce([frame[k] == v for k, v in shape.items()])]
    by = {r: dict(zip(g["tokens"], g["latency_ms"], strict=True))
          for r, g in rows.groupby("routing", observed=True)}
    balanced, power = by["balanced"], by["power_law_1.2"]
    assert power[32] < balanced[32] and balanced[8192] < power[8192]
    for tokens in (32, 8192):
        assert curve(tokens) == pytest.approx(min(balanced[tokens], power[tokens]))


# ---- a small fixture data set ------------------------------------------------------------

# A fixture GPU whose GEMM takes 1e-9 ms per multiply-add: TP's effect is exact arithmetic.
GEMM_M, GEMM_NK = (1, 64, 4096), (256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536)


def _write_fixture(root: Path) -> Path:
    folder = root / "fake"
    folder.mkdir(parents=True)
    rows = [(q, m, n, k, 1e-9 * m * n * k + 0.001) for q in ("bf16",)
            for m in GEMM_M for n in GEMM_NK for k in GEMM_NK]
    gemm = pd.DataFrame(rows, columns=["quant", "m", "n", "k", "latency_ms"])
    attn = [(b, s, h, kv, 128, 0.01 + 1e-7 * b * s * h) for b in (1, 8) for s in (16, 4096)
            for h, kv in ((32, 8), (16, 4))]
    context = pd.DataFrame(attn, columns=["batch", "seq", "heads", "kv_heads", "head_dim",
                                          "latency_ms"])
    generation = context.rename(columns={"seq": "kv_len"})
    car = pd.DataFrame({"num_gpus": [2, 2], "message_bytes": [1024, 2**30],
                        "latency_ms": [0.005, 5.0]})
    nccl = pd.DataFrame({"num_gpus": [2, 2], "message_bytes": [1024, 2**30],
                         "latency_ms": [0.01, 4.0]})
    tables = {"gemm": gemm, "context_attention": context,
              "generation_attention": generation, "custom_all_reduce": car}
    for name, frame in tables.items():
        frame.insert(0, "source_version", "0.1.0")
        frame.to_parquet(folder / f"{name}.parquet", index=False)
    nccl.to_parquet(folder / "nccl_all_reduce.parquet", index=False)
    for name, scale in (("nccl_all_gather", 0.5), ("nccl_reduce_scatter", 0.75)):
        nccl.assign(latency_ms=nccl["latency_ms"] * scale).to_parquet(
            folder / f"{name}.parquet", index=False)
    entry = {"source_version": "0.1.0", "quants": ["bf16"]}
    manifest = {"commit": "f" * 40, "gpus": {"fake": {"tables": {
        name: {"0.1.0": entry} for name in tables}}}}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


@pytest.fixture(scope="module")
def fixture_tables(tmp_path_factory) -> KernelTables:
    return KernelTables.load("fake", data_dir=_write_fixture(tmp_path_factory.mktemp("aic")))


LLAMA_8B = LayerShapes("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256)


def _model(tables: KernelTables, tp: int = 1, quantization: str | None = None):
    return KernelCostModel(LLAMA_8B, known_gpu("h100"), load_engine("vllm"), tables,
                           tensor_parallel=tp, quantization=quantization)


def test_fixture_gemm_exact_at_measured_shapes(fixture_tables):
    curve = fixture_tables.gemm("bf16", 4096, 4096)
    assert curve(64) == pytest.approx(1e-9 * 64 * 4096 * 4096 + 0.001, rel=1e-6)


def test_tensor_parallel_halves_the_gemm_work(fixture_tables):
    one, two = _model(fixture_tables, 1), _model(fixture_tables, 2)
    for gemm in ("_qkv", "_o"):
        work1 = getattr(one, gemm)(4096) - 0.001
        work2 = getattr(two, gemm)(4096) - 0.001
        assert work2 == pytest.approx(work1 / 2, rel=1e-3)
    up1, up2 = one._dense[0](4096) - 0.001, two._dense[0](4096) - 0.001
    assert up2 == pytest.approx(up1 / 2, rel=1e-3)


def test_all_reduce_uses_custom_below_its_limit_and_nccl_above(fixture_tables):
    ar = fixture_tables.all_reduce(2)
    assert ar.custom_max_bytes == 8 * 2**20
    assert ar(1024) == 0.005  # custom, as measured
    assert ar(2**30) == 4.0  # NCCL, as measured
    with pytest.raises(KernelTableError, match="4 GPUs"):
        fixture_tables.all_reduce(4)


def test_exchange_is_nccl_all_gather_then_reduce_scatter_where_both_were_measured(
        fixture_tables, tmp_path):
    exchange = fixture_tables.exchange(2)
    assert exchange(1024) == pytest.approx(0.01 * (0.5 + 0.75))
    assert exchange(2**30) == pytest.approx(4.0 * (0.5 + 0.75))
    assert fixture_tables.exchange(4) is None  # not measured over 4 GPUs
    root = _write_fixture(tmp_path)
    (root / "fake" / "nccl_reduce_scatter.parquet").unlink()
    assert KernelTables.load("fake", data_dir=root).exchange(2) is None


def test_unmeasured_heads_are_priced_from_the_nearest_and_named(fixture_tables):
    grid, note = fixture_tables.generation_attention(32, 4, 128)
    assert "32 heads / 4 KV heads" in note
    assert grid(1, 16) > 0
    with pytest.raises(KernelTableError, match="head_dim 64"):
        fixture_tables.context_attention(32, 8, 64)


def test_unsupported_quantization_is_refused_with_its_reason(fixture_tables):
    with pytest.raises(KernelTableError, match="'int4'.*16-bit and fp8"):
        gemm_quant("int4", "bf16", ["bf16", "fp8"])
    with pytest.raises(KernelTableError, match="no fp8 GEMMs measured"):
        _model(fixture_tables, quantization="fp8")
    assert gemm_quant(None, "fp16", ["bf16"]) == "bf16"  # same tensor-core rate


def test_unknown_version_and_gpu_are_named(fixture_tables):
    with pytest.raises(KernelTableError, match="0.9.0"):
        KernelTables.load("fake", "0.9.0", data_dir=fixture_tables.data_dir)
    with pytest.raises(KernelTableError, match="rtx-4090"):
        KernelTables.load("rtx-4090", data_dir=fixture_tables.data_dir)


def test_fixture_decode_steps_match_predict(fixture_tables):
    model = _model(fixture_tables)
    steps = model.decode_steps_s(rows=12, context=12 * 300, num_steps=5)
    plans = [BatchPlan(decode_seqs=12, num_sampled=12, decode_context=12 * (300 + i))
             for i in range(5)]
    assert steps == [model.predict(p) for p in plans]


# ---- the shipped tables -------------------------------------------------------------------


def _decode(rows: int, context: int = 1024) -> BatchPlan:
    return BatchPlan(decode_seqs=rows, num_sampled=rows, decode_context=rows * context)


def _prefill(tokens: int, context: int = 0) -> BatchPlan:
    full = tokens + context
    return BatchPlan(prefill_tokens=tokens, prefill_seqs=1, num_sampled=1,
                     prefill_attn=tokens * full,
                     prefill_attn_causal=tokens * full - tokens * (tokens - 1) // 2)


@pytest.fixture(scope="module")
def llama_h100() -> KernelCostModel:
    return _model(KernelTables.load("h100", "0.24.0"))


def test_llama_8b_h100_steps_lie_in_a_physical_range(llama_h100):
    decode_1 = llama_h100.predict(_decode(1))
    assert 4e-3 < decode_1 < 15e-3  # ~16 GB of weights at ~3 TB/s, plus the rest
    prefill = llama_h100.predict(_prefill(2048))
    assert 25e-3 < prefill < 120e-3  # ~33 TFLOP at 300-1000 TFLOP/s
    steps = [llama_h100.predict(_decode(rows)) for rows in (1, 8, 32, 128, 256)]
    assert steps == sorted(steps)


def test_prefill_with_cached_context_costs_more_than_without(llama_h100):
    assert llama_h100.predict(_prefill(512, 4096)) > llama_h100.predict(_prefill(512))


def test_shipped_tables_fit_the_size_budget_and_name_their_source():
    size = sum(p.stat().st_size for p in DATA_DIR.rglob("*.parquet"))
    assert size < 12 * 2**20
    manifest = json.loads((DATA_DIR / "manifest.json").read_text())
    assert manifest["license"] == "Apache-2.0" and len(manifest["commit"]) == 40
    assert "Apache License" in (DATA_DIR / "LICENSE").read_text()  # upstream's text


@pytest.mark.parametrize("gpu", ["h100", "l40s", "rtx-pro-6000"])
def test_measured_fp8_gemms_cut_decode_and_speed_prefill_less_than_the_datasheet(gpu):
    """vLLM's FP8 GEMMs as measured: a decode step reads half the weight bytes; a long
    prefill gains less than the datasheet's 2x FLOPs (activation quantization, the kernel's
    own efficiency), but gains."""
    from sim.deployment import DeploymentOptions, build_deployment

    def step(plan: BatchPlan, quantization: str | None) -> float:
        deployment = build_deployment(DeploymentOptions(
            model="llama-3-8b", hardware=gpu, cost="kernels", quantization=quantization))
        return deployment.cost_model.predict(plan)

    assert 0.5 < step(_decode(8), "fp8") / step(_decode(8), None) < 0.8
    assert 0.5 < step(_prefill(4096), "fp8") / step(_prefill(4096), None) < 0.95


def test_block_fp8_gemms_are_priced_as_a_cuda_graph_replays_them():
    """The block-scaled table was timed eagerly (host-bound at few rows); the priced curve
    is the graph-timed per-tensor curve scaled by the two tables' compute-bound ratio, never
    above the eager time, and equal to the eager time where that is the cheaper."""
    eager = Curve([1, 64, 4096, 32768], [0.060, 0.085, 0.30, 2.0])
    tensor = Curve([1, 64, 4096, 32768], [0.008, 0.010, 0.35, 2.5])
    graphed = graph_replayed_block(eager, tensor)
    assert graphed(32768) == pytest.approx(2.0)  # exact where both are compute-bound
    assert graphed(1) == pytest.approx(0.008 * 0.8)  # the launches gone
    assert all(graphed(m) <= eager(m) + 1e-12 for m in (1, 8, 64, 512, 4096, 32768))


def test_shipped_h100_block_fp8_decode_gemm_is_not_host_bound():
    tables = KernelTables.load("h100", "0.24.0")
    block, tensor = tables.gemm("fp8_block", 4096, 4096), tables.gemm("fp8", 4096, 4096)
    assert block(4) < 2 * tensor(4)  # the eager table alone says ~7x
