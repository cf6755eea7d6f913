"""The Deployment: KV pool sized as vLLM sizes it (by hand, dense and MoE), experts priced by
the tokens that reach them, and the options' errors."""

from __future__ import annotations

import dataclasses
import json

import pytest

from sim.cost.roofline import AnalyticCostModel
from sim.cost.roofline_coefficients import expected_active_experts
from sim.deployment import DeploymentOptions, build_deployment, normalize_dtype
from sim.engine.core import BatchPlan
from sim.specs.hardware import hardware_spec
from sim.specs.model_config import resolve_model

GiB = 2**30


# The reserve by hand (sim.specs.kv_reserve): 366 MiB of non-torch memory, 256 MiB more per
# communication group, and the larger of one layer's transient tensors at 2,048 tokens and
# the sampler's 26 bytes per logit over min(256 sequences, 2,048) rows of the vocabulary.
NON_TORCH = 366 * 2**20
COMM_GROUP = 256 * 2**20


def test_dense_pool_by_hand_llama_3_8b_on_one_h100() -> None:
    deployment = build_deployment(DeploymentOptions())
    # Layer peak: 2,048 tokens x (hidden + residual 2 x 4,096 + gate/up/act 3 x 14,336) x 2 B
    # = 209,715,200 B, below the sampler's 256 rows x 128,256 x 26 B = 853,671,936 B.
    layer = 2048 * (2 * 4096 + 3 * 14336) * 2
    sampler = 256 * 128_256 * 26
    assert layer < sampler
    reserve = NON_TORCH + sampler
    assert deployment.kv_pool.gpu_reserve_bytes == reserve == 1_237_450_752
    # 0.9 x 80 GiB, less 8,030,261,248 bf16 weights and the reserve, over a block of
    # 16 tokens x 32 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes.
    by_hand = int((0.9 * 80 * GiB - 8_030_261_248 * 2 - reserve) // (16 * 32 * 8 * 128 * 2 * 2))
    assert deployment.kv_pool.num_blocks == by_hand == 28615
    assert deployment.kv_pool.sized_by == "vllm"


def test_rtx_4090_pool_is_vllm_0_19s_measured_2588_blocks() -> None:
    # The run in sim/data/llmservingsim/bench/examples/RTX4090/Llama-3.1-8B (the non-torch
    # constant's one data point): 2,048 tokens, 256 sequences, 0.9 of 25,250,627,584 B.
    deployment = build_deployment(DeploymentOptions(
        "meta-llama/Llama-3.1-8B", "rtx-4090", "bfloat16", max_num_batched_tokens=2048,
        max_num_seqs=256))
    assert deployment.kv_pool.num_blocks == 2588


def test_reserve_grows_with_the_profiled_limits_and_the_groups() -> None:
    def reserve(**kwargs) -> int:
        return build_deployment(DeploymentOptions(**kwargs)).kv_pool.gpu_reserve_bytes

    assert reserve(max_num_seqs=128) == NON_TORCH + 128 * 128_256 * 26
    # 16,384 tokens: the layer (16,384 x 51,200 x 2 B) outgrows the sampler.
    assert reserve(max_num_batched_tokens=16384) == NON_TORCH + 16384 * 51_200 * 2
    # tp 2: a tensor-parallel group's buffers; the sampler still holds the whole vocabulary.
    assert reserve(tensor_parallel=2) == NON_TORCH + COMM_GROUP + 256 * 128_256 * 26


def test_num_blocks_overrides_the_sized_pool() -> None:
    pool = build_deployment(DeploymentOptions(num_blocks=1234)).kv_pool
    assert (pool.num_blocks, pool.sized_by) == (1234, "--num-blocks")
    assert "1234 blocks" in pool.describe()


def test_moe_pool_by_hand_qwen3_30b_a3b_dp2_ep_on_rtx_pro_6000() -> None:
    deployment = build_deployment(DeploymentOptions(
        "Qwen/Qwen3-30B-A3B-Instruct-2507", "rtx-pro-6000", "bfloat16", data_parallel=2,
        expert_parallel=True))
    experts = 48 * 128 * 3 * 2048 * 768  # layers x experts x (gate, up, down) x h x width
    dense = 30_532_122_624 - experts
    rank_weight_bytes = (dense + experts // 2) * 2  # each of 2 GPUs holds half the experts
    kv_block = 16 * 48 * 4 * 128 * 2 * 2
    # MoE layer: hidden + residual (2,048 x 2 x 2,048), the 2 ranks' gathered hidden states
    # (4,096 x 2,048), router scores (4,096 x 128), and 4,096 x 8 routed rows of gate/up,
    # activation (3 x 768) and down output (2,048), x 2 B = 319,815,680 B; the sampler's
    # 256 x 151,936 x 26 B = 1,011,286,016 B is larger. One data-parallel group's buffers.
    layer = (2048 * 2 * 2048 + 4096 * 2048 + 4096 * 128 + 4096 * 8 * (3 * 768 + 2048)) * 2
    sampler = 256 * 151_936 * 26
    assert layer < sampler
    reserve = NON_TORCH + COMM_GROUP + sampler
    assert deployment.kv_pool.gpu_reserve_bytes == reserve == 1_663_500_288
    by_hand = int((0.9 * 96 * GiB - rank_weight_bytes - reserve) // kv_block)
    assert deployment.kv_pool.gpu_weight_bytes == rank_weight_bytes
    assert deployment.kv_pool.num_blocks == by_hand == 37533
    assert "KV pool: 37533 blocks" in deployment.kv_pool.describe()


def test_deployment_is_frozen_and_its_json_is_whole() -> None:
    deployment = build_deployment(DeploymentOptions(tensor_parallel=2, num_blocks=500))
    with pytest.raises(dataclasses.FrozenInstanceError):
        deployment.dtype = "fp16"  # type: ignore[misc]
    record = json.loads(json.dumps(deployment.to_dict()))
    assert record["kv_pool"]["num_blocks"] == 500
    assert record["kv_pool"]["sized_by"] == "--num-blocks"
    assert record["parallel"]["tensor_parallel"] == 2
    assert record["model"]["num_params"] == 8_030_261_248
    assert record["hardware"]["name"] == "h100"


def test_the_default_roofline_deployment_prices_as_the_preset() -> None:
    plan = BatchPlan()
    plan.prefill_tokens, plan.prefill_seqs, plan.prefill_attn = 900, 2, 400_000
    plan.decode_seqs, plan.decode_context = 40, 60_000
    assert build_deployment(DeploymentOptions(cost="roofline")).cost_model.predict(plan) == \
        AnalyticCostModel.preset().predict(plan)


@pytest.mark.parametrize(("text", "dtype"), [("auto", "bf16"), ("bfloat16", "bf16"),
                                             ("float16", "fp16"), ("half", "fp16")])
def test_vllm_dtype_spellings(text: str, dtype: str) -> None:
    assert normalize_dtype(text) == dtype


@pytest.mark.parametrize(("options", "message"), [
    (DeploymentOptions(dtype="float32"), "--dtype"),
    (DeploymentOptions(gpu_memory_utilization=1.5), "--gpu-memory-utilization"),
    (DeploymentOptions(data_parallel=2, expert_parallel=True), "dense"),
    (DeploymentOptions("mistralai/Mixtral-8x7B-v0.1", "h200", data_parallel=3,
                       expert_parallel=True), "do not split"),
    (DeploymentOptions("meta-llama/Llama-3.1-70B", "rtx-4090"), "does not fit"),
    (DeploymentOptions(max_num_seqs=0), "max_num_seqs"),
    (DeploymentOptions(max_num_batched_tokens=-5), "max_num_batched_tokens"),
])
def test_bad_options_name_what_is_wrong(options: DeploymentOptions, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_deployment(options)


def test_expected_active_experts_grows_from_k_to_all() -> None:
    assert expected_active_experts(128, 8, 1) == pytest.approx(8)
    assert expected_active_experts(128, 8, 2) == pytest.approx(128 * (1 - (120 / 128) ** 2))
    assert expected_active_experts(128, 8, 10_000) == pytest.approx(128)


def test_a_step_reads_the_experts_its_tokens_reach() -> None:
    spec = resolve_model("Qwen/Qwen3-30B-A3B")
    cost = AnalyticCostModel(spec, hardware_spec("h100"))
    bytes_s = cost.hardware.mem_bandwidth_bytes_s * cost.bandwidth_efficiency
    all_experts_s = spec.expert_params_total * 2 / bytes_s
    assert cost.expert_weights_s(1) == pytest.approx(all_experts_s * 8 / 128)
    assert cost.expert_weights_s(100_000) == pytest.approx(all_experts_s)
    # One decode row reads k of 128 experts: far less than every weight.
    one_row = cost.decode_steps_s(1, 100, 1)[0]
    assert one_row < (spec.num_params * 2 / bytes_s) / 3


def test_expert_parallel_holds_a_share_of_experts_and_pays_the_exchange() -> None:
    spec = resolve_model("Qwen/Qwen3-30B-A3B")
    alone = AnalyticCostModel(spec, hardware_spec("h100"))
    ep = AnalyticCostModel(spec, hardware_spec("h100"), data_parallel=2, expert_parallel=True)
    assert ep.rank_weight_bytes < alone.rank_weight_bytes
    # With the other rank's tokens arriving, each GPU's half of the experts is reached by
    # twice the tokens: one row reaches about as many local experts as 2 rows on one GPU, /2.
    assert ep.expert_weights_s(1) == pytest.approx(alone.expert_weights_s(2) / 2)
    plan = BatchPlan()
    plan.decode_seqs, plan.decode_context, plan.num_sampled = 8, 8000, 8
    assert ep.predict(plan) > 0 and ep._comm_s_per_token > 0 == alone._comm_s_per_token


def test_llama4_chunked_attention_is_priced_as_full_and_said_so() -> None:
    """Llama 4's RoPE layers attend within 8,192-token chunks: priced as full attention,
    which is exact while a sequence fits one chunk, and the deployment line says so."""
    deployment = build_deployment(DeploymentOptions(
        model="meta-llama/Llama-4-Scout-17B-16E-Instruct", hardware="h200", tensor_parallel=2))
    assert "8192-token chunks priced as full attention" in deployment.description
    assert "chunks" not in build_deployment(DeploymentOptions()).description


@pytest.mark.parametrize("quantization", [None, "fp8"])
def test_description_states_the_fitted_coverage_at_the_engines_budget(quantization) -> None:
    deployment = build_deployment(DeploymentOptions(hardware="h100", quantization=quantization,
                                                    cost="gpu"))
    # The description holds the lab's 2,048-token budget; description_at restates it alone.
    assert "steps up to 2048 tokens inside" in deployment.description
    assert deployment.description_at(2048) == deployment.description
    at_8192 = deployment.description_at(8192)
    assert "steps up to 8192 tokens beyond the profiled 4096" in at_8192
    assert "steps up to 2048" not in at_8192
    before, after = deployment.coverage_frame
    assert at_8192.startswith(before) and at_8192.endswith(after)
    assert before.startswith("llama-3-8b on h100 (bf16") and before.endswith("gpu-fitted: ")
    # The notes after the coverage line stay after it.
    assert after == ("; fp8 GEMMs at the efficiencies fitted on 16-bit ones (extrapolated)"
                     if quantization else "")


def test_description_without_a_fitted_model_holds_for_every_budget() -> None:
    deployment = build_deployment(DeploymentOptions(cost="roofline"))
    assert deployment.coverage_frame is None
    assert deployment.description_at(8192) == deployment.description
