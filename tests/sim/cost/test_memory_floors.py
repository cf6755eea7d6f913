"""Decode attention and fused-MoE layers from the kernel tables never read a step's KV or
experts faster than the GPU's memory delivers them. The tables time a kernel replayed in a loop,
so a KV or a few experts that fit the L2 cache (128 MB on the RTX PRO 6000, 96 MB on the L40S)
are read from the cache; in a model's step every other layer runs between two reads of one
layer's."""

from __future__ import annotations

import pytest

from sim.cost.kernel_cost import KernelCostModel
from sim.cost.kernel_curves import STREAMED_KV_BYTES
from sim.cost.kernel_tables import available_gpus
from sim.deployment import DeploymentOptions, build_deployment
from sim.engine.core import BatchPlan
from sim.specs.hardware import hardware_spec

GPUS = available_gpus()
SHAPES = [(rows, length) for rows in (1, 8, 32, 64, 128, 256) for length in (128, 512, 1024,
                                                                               2048, 4096)]


def _model(gpu: str, kv_cache_dtype: str = "auto", name: str = "Qwen/Qwen3-32B"
           ) -> KernelCostModel:
    model = build_deployment(DeploymentOptions(
        model=name, hardware=gpu, tensor_parallel=2, cost="kernels",
        kv_cache_dtype=kv_cache_dtype)).cost_model
    assert isinstance(model, KernelCostModel)
    return model


def _read_rate(model: KernelCostModel, rows: int, length: int, seconds: float) -> float:
    """KV bytes a layer reads over `seconds`, a sliding-window layer's at most the window."""
    if model._window:
        share = model._window_share
        length = share * min(length, model._window) + (1 - share) * length
    return rows * length * model._kv_bytes_layer / seconds


@pytest.mark.parametrize(("gpu", "name"), [(gpu, name) for gpu in GPUS
                                           for name in ("Qwen/Qwen3-32B", "openai/gpt-oss-120b")
                                           if gpu != "a100-80gb" or name.startswith("Qwen")])
def test_decode_attention_never_reads_kv_faster_than_the_gpu_memory(gpu, name):
    """(gpt-oss: half its layers read at most a 128-token window; the A100's tables hold no
    MXFP4 MoE for it)"""
    model, peak = _model(gpu, name=name), hardware_spec(gpu).mem_bandwidth_bytes_s
    for rows, length in SHAPES:
        fast_path = model._decode_attention_s(rows, [rows * length])[0]
        mean_path = model._decode_mean_s(rows, model._generation.row(rows), length)
        assert fast_path == pytest.approx(mean_path)
        assert _read_rate(model, rows, length, fast_path) <= peak, (gpu, rows, length)


@pytest.mark.parametrize("gpu", ["rtx-pro-6000", "l40s"])
def test_a_kv_that_fits_the_cache_is_priced_above_the_raw_table(gpu):
    """(the case the floor exists for: these GPUs' tables read a cache-sized KV faster than
    their memory's datasheet rate)"""
    model, peak = _model(gpu), hardware_spec(gpu).mem_bandwidth_bytes_s
    raised = [(rows, length) for rows, length in SHAPES
              if _read_rate(model, rows, length,
                            model._generation.row(rows)(length) * 1e-3) > peak]
    assert raised  # the raw table beats the memory somewhere
    rows, length = raised[0]
    priced = model._decode_attention_s(rows, [rows * length])[0]
    assert priced > model._generation.row(rows)(length) * 1e-3


@pytest.mark.parametrize(("gpu", "kv"), [(gpu, kv) for gpu in GPUS for kv in ("auto", "fp8")
                                         if kv == "auto" or hardware_spec(gpu).peak_fp8_flops])
def test_the_streaming_rate_is_the_tables_own_and_below_the_datasheet(gpu, kv):
    model = _model(gpu, kv)
    rate = model._kv_bytes_layer / (model._kv_ms_per_token * 1e-3)
    assert 0.6 < rate / hardware_spec(gpu).mem_bandwidth_bytes_s < 1.0
    # a KV far larger than any cache keeps the table's own price at its median point
    big = [(rows, length) for rows, curve in model._generation.rows.items()
           for length in curve.xs
           if rows * length * model._kv_bytes_layer >= STREAMED_KV_BYTES]
    kept = sum(model._decode_attention_s(rows, [int(rows * length)])[0]
               == pytest.approx(model._generation.row(rows)(length) * 1e-3)
               for rows, length in big)
    assert kept >= len(big) // 2


@pytest.mark.parametrize("prefill_tokens", [0, 256])
def test_a_whole_step_pays_the_floor_with_or_without_a_prefill_chunk(prefill_tokens):
    """64 rows over 1,024 keys read 134 MB a layer on each of two RTX PRO 6000s: the raw
    table prices it at 1.9 TB/s, above the GDDR7's 1.79."""
    model = _model("rtx-pro-6000")
    plan = BatchPlan(prefill_seqs=1 if prefill_tokens else 0, prefill_tokens=prefill_tokens,
                     prefill_attn=prefill_tokens ** 2, decode_seqs=64,
                     decode_context=64 * 1024)
    floored = model.predict(plan)
    model._kv_ms_per_token = 0.0  # the raw table
    assert floored > model.predict(plan)


def _moe_model(gpu: str, **parallel) -> KernelCostModel:
    model = build_deployment(DeploymentOptions(
        model="Qwen/Qwen3-30B-A3B-Instruct-2507", hardware=gpu, cost="kernels",
        **parallel)).cost_model
    assert isinstance(model, KernelCostModel)
    return model


def _experts_bytes(model: KernelCostModel, experts: int, inter: int) -> float:
    return experts * 3 * model.shapes.hidden_size * inter * 2  # gate, up, down in bf16


@pytest.mark.parametrize(("gpu", "tp"), [("rtx-pro-6000", 1), ("l40s", 2), ("h100", 1),
                                         ("b200", 1)])
def test_one_token_reads_its_top_k_experts_no_faster_than_the_gpu_memory(gpu, tp):
    """Qwen3-30B-A3B: a token's 8 experts of 2,048 x 768 (75 MB, over tp GPUs)."""
    model = _moe_model(gpu, tensor_parallel=tp)
    inter = model.shapes.moe_intermediate_size // tp
    least = _experts_bytes(model, model.shapes.experts_per_token, inter)
    assert least / model.moe_mlp_s(1) <= hardware_spec(gpu).mem_bandwidth_bytes_s


def test_the_l40s_moe_table_reads_a_tokens_experts_from_its_cache():
    """(the case the floor exists for: 38 MB of experts a GPU read at 1.45 TB/s, on 0.86 TB/s
    of memory)"""
    model = _moe_model("l40s", tensor_parallel=2)
    floored = model.moe_mlp_s(1)
    model._fewest_experts_ms = 0.0  # the raw table
    assert floored > 1.2 * model.moe_mlp_s(1)


def test_expert_parallel_counts_the_busiest_gpus_share_of_a_tokens_experts():
    """Under EP over 2 GPUs a token's 8 experts leave at least 4 whole ones on one GPU."""
    model = _moe_model("rtx-pro-6000", data_parallel=2, expert_parallel=True)
    rate = model._kv_bytes_layer / model._kv_ms_per_token  # bytes a ms
    least = _experts_bytes(model, 4, model.shapes.moe_intermediate_size)
    assert model._fewest_experts_ms == pytest.approx(least / rate)
