"""vLLM's --kv-cache-dtype: an FP8 KV cache stores K and V in one byte, so the pool holds
twice the tokens in the same memory and attention reads half the KV bytes."""

from __future__ import annotations

import pytest

from sim.cost.gpu_cost import gpu_cost_backend
from sim.cost.kernel_cost import kernel_cost_backend
from sim.cost.kernel_tables import KernelTables
from sim.cost.roofline import KV_CACHE_DTYPES, AnalyticCostModel
from sim.deployment import DeploymentOptions, build_deployment
from sim.engine.core import BatchPlan
from sim.specs.engine_limits import kv_blocks
from sim.specs.hardware import hardware_spec
from sim.specs.model_config import resolve_model

FP8_KV = ("fp8", "fp8_e4m3", "fp8_e5m2")


def _decode(rows: int, context: int) -> BatchPlan:
    return BatchPlan(decode_seqs=rows, decode_context=rows * context, num_sampled=rows)


def test_flag_values_are_vllms() -> None:
    assert ("auto", *FP8_KV) == KV_CACHE_DTYPES


@pytest.mark.parametrize("kv", FP8_KV)
def test_fp8_kv_halves_the_bytes_per_token(kv: str) -> None:
    """Llama-3.1-70B: 2 (K, V) x 80 layers x 8 KV heads x 128 x 2 bytes = 327,680 a token."""
    auto = build_deployment(DeploymentOptions(model="meta-llama/Llama-3.1-70B",
                                              tensor_parallel=2, quantization="fp8"))
    fp8 = build_deployment(DeploymentOptions(model="meta-llama/Llama-3.1-70B",
                                             tensor_parallel=2, quantization="fp8",
                                             kv_cache_dtype=kv))
    assert auto.kv_bytes_per_token == 327_680 and fp8.kv_bytes_per_token == 163_840
    assert fp8.kv_pool.block_bytes * 2 == auto.kv_pool.block_bytes
    assert (auto.kv_cache_dtype, fp8.kv_cache_dtype) == ("auto", kv)
    assert fp8.to_dict()["kv_cache_dtype"] == kv and f"{kv} KV cache" in fp8.description


def test_fp8_kv_pool_is_vllms_formula_at_one_byte_an_element() -> None:
    """blocks = (utilization x memory - weights - reserve) / (block x per-GPU KV bytes):
    weights and reserve do not change, the block's bytes halve."""
    options = DeploymentOptions(model="meta-llama/Llama-3.1-70B", tensor_parallel=2,
                                quantization="fp8", kv_cache_dtype="fp8")
    pool = build_deployment(options).kv_pool
    per_gpu_block = 16 * 2 * 80 * (8 // 2) * 128 * 1
    memory = 0.9 * pool.gpu_memory_bytes - pool.gpu_weight_bytes - pool.gpu_reserve_bytes
    assert pool.num_blocks == kv_blocks(memory, per_gpu_block)
    auto = build_deployment(DeploymentOptions(model="meta-llama/Llama-3.1-70B",
                                              tensor_parallel=2, quantization="fp8"))
    assert auto.kv_pool.gpu_kv_bytes == pool.gpu_kv_bytes
    assert pool.num_blocks in (2 * auto.kv_pool.num_blocks, 2 * auto.kv_pool.num_blocks + 1)


def test_fp8_kv_halves_the_roofline_kv_reads() -> None:
    spec, h100 = resolve_model("llama-3-8b"), hardware_spec("h100")
    auto = AnalyticCostModel(spec, h100)
    fp8 = AnalyticCostModel(spec, h100, kv_cache_dtype="fp8")
    assert fp8.gpu_kv_bytes_per_token * 2 == auto.gpu_kv_bytes_per_token
    plan = _decode(64, 8192)  # memory-bound: weights + KV reads
    assert fp8.predict(plan) < auto.predict(plan)
    weights_only = auto.predict(_decode(64, 1))
    assert fp8.predict(plan) - weights_only == pytest.approx(
        (auto.predict(plan) - weights_only) / 2, rel=0.01)


def test_fp8_kv_halves_the_fitted_models_decode_attention_reads() -> None:
    spec, h100 = resolve_model("llama-3-8b"), hardware_spec("h100")
    auto, fp8 = gpu_cost_backend(spec, h100), gpu_cost_backend(spec, h100, kv_cache_dtype="fp8")
    assert fp8._s_per_decode_kv * 2 == pytest.approx(auto._s_per_decode_kv)
    assert fp8.predict(_decode(64, 8192)) < auto.predict(_decode(64, 8192))


def test_kernel_model_reads_the_fp8_kv_tables_where_measured() -> None:
    spec, h100 = resolve_model("llama-3-8b"), hardware_spec("h100")
    tables = KernelTables.load("h100")
    assert tables.kv_cache_dtypes("generation_attention") == ["auto", "fp8"]
    fp8 = kernel_cost_backend(spec, h100, tables, kv_cache_dtype="fp8")
    assert "attention from the FP8-KV tables" in fp8.describe()
    auto = kernel_cost_backend(spec, h100, tables)
    assert fp8.predict(_decode(64, 8192)) < auto.predict(_decode(64, 8192))


def test_kernel_model_scales_the_16_bit_tables_where_fp8_kv_was_not_measured() -> None:
    spec, h100 = resolve_model("llama-3-8b"), hardware_spec("h100")
    # Every shipped H100 version measured FP8 KV: a version without it, faked.
    tables = _without_fp8_kv(KernelTables.load("h100"))
    fp8 = kernel_cost_backend(spec, h100, tables, kv_cache_dtype="fp8")
    auto = kernel_cost_backend(spec, h100, tables)
    assert "16-bit table x0.5" in fp8.describe()
    assert fp8._generation.row(8)(4096) == pytest.approx(auto._generation.row(8)(4096) / 2)


def _without_fp8_kv(tables: KernelTables) -> KernelTables:
    class Sixteen(KernelTables):
        def kv_cache_dtypes(self, table: str) -> list[str]:
            return ["auto"]
    return Sixteen(tables.gpu, tables.vllm_version, tables.data_dir, tables.sources)


@pytest.mark.parametrize("cost", ["gpu", "roofline", "auto"])
def test_a_gpu_without_fp8_refuses_an_fp8_kv_cache_by_name(cost: str) -> None:
    with pytest.raises(ValueError, match="a100-80gb has no FP8"):
        build_deployment(DeploymentOptions(hardware="a100-80gb", kv_cache_dtype="fp8",
                                           cost=cost))


def test_an_unknown_kv_cache_dtype_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="choose from auto, fp8"):
        build_deployment(DeploymentOptions(kv_cache_dtype="int8"))
