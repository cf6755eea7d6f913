"""`--cost auto`, the default, prices with vLLM's measured kernels where the GPU has tables and
with the fitted model elsewhere."""

from __future__ import annotations

import pytest

from sim.cost.gpu_cost import GpuCostModel
from sim.cost.kernel_cost import KernelCostModel
from sim.deployment import DeploymentOptions, build_deployment
from sim.engine.core import BatchPlan


def test_the_default_prices_from_the_measured_kernels():
    deployment = build_deployment(DeploymentOptions())
    assert type(deployment.cost_model) is KernelCostModel and deployment.vllm_version
    assert "priced by vllm-kernels" in deployment.description
    fitted = build_deployment(DeploymentOptions(hardware="rtx-4090"))
    assert type(fitted.cost_model) is GpuCostModel and fitted.vllm_version is None


@pytest.mark.parametrize("gpu", ["h100", "b200", "l40s"])
def test_auto_prices_with_the_newest_measured_kernels(gpu):
    deployment = build_deployment(DeploymentOptions(hardware=gpu, cost="auto"))
    assert isinstance(deployment.cost_model, KernelCostModel)
    assert deployment.vllm_version == "0.24.0" == deployment.to_dict()["vllm_version"]
    assert f"priced by vllm-kernels: vLLM 0.24.0 kernel tables measured on {gpu}" in (
        deployment.description)
    assert deployment.to_dict()["cost_model"] == "KernelCostModel"


def test_a_gpu_without_tables_falls_back_to_the_fitted_model_and_says_so():
    deployment = build_deployment(DeploymentOptions(hardware="rtx-4090", cost="auto"))
    assert type(deployment.cost_model) is GpuCostModel and deployment.vllm_version is None
    assert "priced by gpu-fitted: no measured vLLM kernels" in deployment.description
    assert "extrapolated from the datasheet" in deployment.description


def test_latent_attention_falls_back_naming_why():
    deployment = build_deployment(DeploymentOptions(model="deepseek-ai/DeepSeek-V2-Lite",
                                                    cost="auto"))
    assert type(deployment.cost_model) is GpuCostModel
    assert "latent attention (MLA)" in deployment.description


def test_an_older_vllm_version_prices_with_its_own_tables():
    old = build_deployment(DeploymentOptions(vllm_version="0.19.0", cost="auto"))
    assert old.vllm_version == "0.19.0" and "vLLM 0.19.0" in old.description
    reused = build_deployment(DeploymentOptions(vllm_version="0.22.0", cost="auto"))
    assert "0.24.0's, which upstream reuses for 0.22.0" in reused.description


def test_version_and_cost_choices_are_checked_by_name():
    with pytest.raises(ValueError, match="h100 has kernel tables for vLLM 0.14.0"):
        build_deployment(DeploymentOptions(vllm_version="0.20.0", cost="auto"))
    with pytest.raises(ValueError, match="--cost gpu has none"):
        build_deployment(DeploymentOptions(cost="gpu", vllm_version="0.24.0"))
    with pytest.raises(ValueError, match="--cost kernels: no vLLM kernel tables for GPU"):
        build_deployment(DeploymentOptions(hardware="rtx-4090", cost="kernels"))
    assert type(build_deployment(DeploymentOptions(cost="gpu")).cost_model) is GpuCostModel


def test_tensor_parallel_and_moe_deployments_price_from_tables():
    tp4 = build_deployment(DeploymentOptions(model="meta-llama/Llama-3.1-70B",
                                             tensor_parallel=4, cost="kernels")).cost_model
    moe = build_deployment(DeploymentOptions(model="Qwen/Qwen3-30B-A3B", cost="kernels")).cost_model
    assert isinstance(tp4, KernelCostModel) and isinstance(moe, KernelCostModel)
    assert tp4.describe() == tp4.tables.describe()  # every shape measured, no neighbour
    assert moe.mlp_s(64) > moe.mlp_s(1)


def _decode_part_s(model: KernelCostModel, plan: BatchPlan) -> float:
    """A layer's attention in `plan` less its prefill attention: the decode rows' share."""
    layer, _ = model._with_attention(plan, 0.0, 0.0)
    return layer - (model.prefill_attention_s(plan) if plan.prefill_tokens else 0.0)


@pytest.mark.parametrize("model, grouped", [("meta-llama/Llama-3.1-8B", True),
                                            ("meta-llama/Llama-2-7b-hf", False)])
def test_decode_rows_beside_a_prefill_chunk_lose_their_gqa_sharing(model, grouped):
    """vLLM runs a mixed batch as one varlen kernel: the decode table's time (a decode-only
    batch) grows by the measured mixed-kernel factor for grouped-query models only."""
    kernels = build_deployment(DeploymentOptions(model=model, hardware="rtx-pro-6000",
                                                 cost="kernels")).cost_model
    decode = BatchPlan(decode_seqs=32, num_sampled=32, decode_context=32 * 600,
                       decode_context_max=600)
    mixed = BatchPlan(decode_seqs=32, num_sampled=33, decode_context=32 * 600,
                      decode_context_max=600, prefill_tokens=512, prefill_attn=512 * 512,
                      prefill_attn_causal=512 * 513 // 2, prefill_seqs=1,
                      prefill_chunk_max=512, prefill_context_max=512)
    factor = kernels.terms.mixed_decode_factor(32, 600, kernels._group)
    assert (factor > 1.0) is grouped
    assert _decode_part_s(kernels, mixed) == pytest.approx(factor * _decode_part_s(kernels,
                                                                                   decode))
