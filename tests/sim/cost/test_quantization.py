"""FP8 quantization (vLLM's --quantization fp8): the linear layers' weights in one byte, their
GEMMs on FP8 tensor cores where the GPU has them; embeddings, lm_head, norms and KV unchanged."""

from __future__ import annotations

import pytest

from sim.cost.gpu_cost import gpu_cost_backend
from sim.cost.roofline import AnalyticCostModel
from sim.deployment import DeploymentOptions, build_deployment
from sim.engine.core import BatchPlan
from sim.specs.hardware import hardware_spec
from sim.specs.model_config import resolve_model


def _decode(rows: int, context: int) -> BatchPlan:
    return BatchPlan(decode_seqs=rows, decode_context=rows * context, num_sampled=rows)


def _prefill(tokens: int) -> BatchPlan:
    return BatchPlan(prefill_tokens=tokens, prefill_seqs=1, num_sampled=1,
                     prefill_attn=tokens * tokens,
                     prefill_attn_causal=tokens * (tokens + 1) // 2)


def test_fp8_weights_by_hand_llama_3_8b() -> None:
    """q/k/v/o and the MLP in one byte a weight; the two 128,256 x 4,096 embedding matrices
    and 65 norms of 4,096 stay 16-bit."""
    spec = resolve_model("llama-3-8b")
    linear = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024) + 32 * 3 * 4096 * 14336
    other = 2 * 128256 * 4096 + 65 * 4096
    assert spec.quantizable_params == linear and spec.num_params == linear + other
    roofline = AnalyticCostModel(spec, hardware_spec("h100"), quantization="fp8")
    assert roofline.rank_weight_bytes == roofline.weight_bytes == linear + 2 * other
    bf16 = AnalyticCostModel(spec, hardware_spec("h100"))
    assert bf16.rank_weight_bytes == bf16.weight_bytes == 2 * spec.num_params


@pytest.mark.parametrize("cost", ["gpu", "roofline"])
@pytest.mark.parametrize("gpu", ["h100", "l40s", "rtx-pro-6000"])
def test_fp8_halves_what_decode_reads_and_speeds_a_compute_bound_prefill(cost, gpu):
    """A decode step reads the weights: FP8 cuts it toward half (KV, attention and the
    lm_head do not shrink). A long prefill is compute-bound: FP8 tensor cores do twice the
    FLOPs, the attention and the 16-bit ops around the GEMMs do not speed up."""
    def step(plan: BatchPlan, quantization: str | None) -> float:
        deployment = build_deployment(DeploymentOptions(
            model="llama-3-8b", hardware=gpu, cost=cost, quantization=quantization))
        return deployment.cost_model.predict(plan)

    assert 0.5 < step(_decode(8, 1024), "fp8") / step(_decode(8, 1024), None) < 0.8
    assert 0.5 < step(_prefill(4096), "fp8") / step(_prefill(4096), None) < 0.8


def test_fp8_needs_fp8_tensor_cores() -> None:
    """vLLM runs FP8 weights on an A100 as weight-only kernels, which are not priced."""
    with pytest.raises(ValueError, match="a100-80gb has no FP8 tensor cores"):
        build_deployment(DeploymentOptions(hardware="a100-80gb", quantization="fp8"))


def test_an_fp8_deployment_fits_where_16_bit_weights_do_not_and_says_so() -> None:
    options = DeploymentOptions(model="meta-llama/Llama-4-Scout-17B-16E-Instruct",
                                hardware="h100", tensor_parallel=2, expert_parallel=True)
    with pytest.raises(ValueError, match=r"\(bf16\) does not fit on h100 x 2"):
        build_deployment(options)
    fp8 = build_deployment(DeploymentOptions(**{**options.__dict__, "quantization": "fp8",
                                                "cost": "kernels"}))
    # vLLM's fp8 kernels are measured on the H100; the fitted model extrapolates to them.
    assert "(bf16, fp8 weights)" in fp8.description and "vllm-kernels" in fp8.description
    fitted = build_deployment(DeploymentOptions(**{**options.__dict__, "quantization": "fp8",
                                                   "cost": "gpu"}))
    assert "extrapolated" in fitted.description
    assert fp8.to_dict()["quantization"] == "fp8" and fp8.kv_pool.num_blocks > 0
    assert build_deployment(DeploymentOptions()).to_dict()["quantization"] is None


def test_unknown_quantization_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="quantization 'int4'"):
        AnalyticCostModel(resolve_model("llama-3-8b"), hardware_spec("h100"),
                          quantization="int4")
    with pytest.raises(ValueError, match="quantization 'int4'"):
        gpu_cost_backend(resolve_model("llama-3-8b"), hardware_spec("h100"),
                         quantization="int4")
