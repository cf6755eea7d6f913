"""gpt-oss (sliding-window layers, attention sinks, MXFP4 experts) and MiniMax-M2 (256
experts, q/k norms over all heads, block FP8) from their config.json."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from sim.cost.gpu_cost import gpu_cost_backend
from sim.cost.kernel_cost import kernel_cost_backend
from sim.cost.kernel_tables import KernelTables
from sim.cost.roofline import AnalyticCostModel
from sim.cost.roofline_coefficients import windowed_sums
from sim.deployment import DeploymentOptions, build_deployment
from sim.engine.core import BatchPlan
from sim.specs.hardware import hardware_spec
from sim.specs.model_config import (
    MODELS_DIR,
    UnsupportedModelError,
    resolve_model,
    spec_from_config,
)

GPT_OSS = "openai/gpt-oss-120b"
MINIMAX = "MiniMaxAI/MiniMax-M2.5"


def _config(hf_id: str) -> dict:
    return json.loads((MODELS_DIR / (hf_id.replace("/", "--") + ".json")).read_text())


def test_gpt_oss_config_reads_windows_sinks_and_mxfp4_experts():
    spec = resolve_model(GPT_OSS)
    assert (spec.num_layers, spec.sliding_window, spec.num_sliding_layers) == (36, 128, 18)
    assert (spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size) == (
        128, 4, 2880)
    assert spec.expert_quantization == "mxfp4" and spec.quantization is None
    assert spec.attention_sinks and spec.num_dense_layers == 0


def test_minimax_config_reads_experts_block_fp8_and_norms_over_all_heads():
    spec = resolve_model(MINIMAX)
    assert (spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size) == (
        256, 8, 1536)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim) == (48, 8, 128)
    assert spec.quantization == "fp8" and spec.qk_norm and spec.qk_norm_across_heads
    assert spec.num_sliding_layers == 0 and spec.shared_expert_intermediate_size == 0


@pytest.mark.parametrize(("hf_id", "active", "rel"), [
    # OpenAI counts 5.13B active without the input embedding.
    (GPT_OSS, 5.13e9, 0.01),
    # MiniMax: "10B activated" (rounded), without the embedding and the LM head.
    (MINIMAX, 10e9, 0.03),
])
def test_active_parameters_match_the_model_cards(hf_id: str, active: float, rel: float):
    spec = resolve_model(hf_id)
    matrices = 1 if hf_id == GPT_OSS else 2
    embed = matrices * spec.vocab_size * spec.hidden_size
    assert spec.num_active_params - embed == pytest.approx(active, rel=rel)


def test_mxfp4_experts_take_4_25_bits_a_weight_and_the_rest_16():
    spec = resolve_model(GPT_OSS)
    experts = spec.expert_params_total
    assert spec.weight_bytes(2, 2) == int((spec.num_params - experts) * 2 + experts * 4.25 / 8)
    # The checkpoint: about 60.8 GiB of weights.
    assert spec.weight_bytes(2, 2) / 2**30 == pytest.approx(60.8, rel=0.01)
    h100 = hardware_spec("h100")
    mxfp4 = AnalyticCostModel(spec, h100, tensor_parallel=4)
    bf16 = AnalyticCostModel(replace(spec, expert_quantization=None), h100, tensor_parallel=4)
    assert mxfp4._expert_read_s == pytest.approx(bf16._expert_read_s * 4.25 / 16)
    dense = (spec.num_params - experts) * 2
    assert mxfp4.rank_weight_bytes == pytest.approx((dense + experts * 4.25 / 8) / 4, rel=1e-6)
    fitted = gpu_cost_backend(spec, h100, tensor_parallel=4)
    assert fitted._expert_bytes == 4.25 / 8 and fitted._expert_peak is None  # 16-bit GEMMs


def test_sliding_window_bound_is_exact_when_every_context_passes_the_window():
    spec = resolve_model(GPT_OSS)
    model = gpu_cost_backend(spec, hardware_spec("h100"), tensor_parallel=2)
    contexts = [300, 500, 1000]  # every row past the 128-token window
    plan = BatchPlan(decode_seqs=3, decode_context=sum(contexts))
    exact = (sum(contexts) + sum(min(c, 128) for c in contexts)) / 2  # 18 of 36 layers each
    assert model.windowed_mean(plan)[1] == pytest.approx(exact)
    # A prefill chunk whose queries all sit past the window: n x window pairs exactly.
    chunk, before = 64, 1000
    pairs = chunk * before + chunk * (chunk + 1) // 2
    plan = BatchPlan(prefill_tokens=chunk, prefill_seqs=1, prefill_attn_causal=pairs,
                     prefill_attn=chunk * (before + chunk))
    assert model.windowed_mean(plan)[0] == pytest.approx((pairs + chunk * 128) / 2)
    # Below the window the totals give an upper bound, never less than the rows' sums.
    short = BatchPlan(decode_seqs=2, decode_context=50 + 1000)
    assert model.windowed_mean(short)[1] >= (1050 + 50 + 128) / 2
    roofline = AnalyticCostModel(spec, hardware_spec("h100"), tensor_parallel=2)
    assert windowed_sums(roofline, plan, chunk)[0] == pytest.approx(
        plan.prefill_attn + min(plan.prefill_attn, chunk * 128))


def test_windowed_fast_forward_gives_predicts_floats():
    for model in (gpu_cost_backend(resolve_model(GPT_OSS), hardware_spec("h100"), 2),
                  AnalyticCostModel(resolve_model(GPT_OSS), hardware_spec("h100"),
                                    tensor_parallel=2)):
        steps = model.decode_steps_s(4, 4 * 100, 60)  # contexts cross the window
        assert steps == [model.predict(BatchPlan(decode_seqs=4, decode_context=4 * 100 + 4 * k))
                         for k in range(60)]
        assert steps[-1] > steps[0]


def test_gpt_oss_pool_holds_the_full_attention_layers_and_says_so():
    deployment = build_deployment(DeploymentOptions(GPT_OSS, "h100", tensor_parallel=2))
    assert deployment.kv_pool.block_bytes == 2 * 18 * 8 * 64 * 2 * 16
    for words in ("18 sliding-window layers", "full-attention layers' bytes",
                  "attention sinks", "mxfp4 experts weight-only"):
        assert words in deployment.description


def test_minimax_deploys_on_four_h100s_with_expert_parallel():
    deployment = build_deployment(DeploymentOptions(MINIMAX, "h100", tensor_parallel=4,
                                                    expert_parallel=True))
    assert deployment.quantization == "fp8" and deployment.kv_pool.num_blocks > 0


@pytest.mark.parametrize(("changes", "field"), [
    # Windows on other than half the layers, or on a model type not priced with them.
    ({"layer_types": ["sliding_attention"] * 3 + ["full_attention"] * 33}, "sliding"),
    ({"model_type": "mistral", "layer_types": None}, "sliding_window"),
    # MXFP4 beyond the experts (attention quantized too).
    ({"quantization_config": {"quant_method": "mxfp4",
                              "modules_to_not_convert": ["lm_head"]}}, "mxfp4.*self_attn"),
])
def test_what_gpt_oss_variants_still_cannot_price_is_refused(changes: dict, field: str):
    with pytest.raises(UnsupportedModelError, match=field):
        spec_from_config({**_config(GPT_OSS), **changes}, "m")


def test_minimax_other_qk_norm_types_are_refused():
    with pytest.raises(UnsupportedModelError, match="qk_norm_type"):
        spec_from_config({**_config(MINIMAX), "qk_norm_type": "per_head"}, "m")


def _decode(rows: int, context: int) -> BatchPlan:
    return BatchPlan(decode_seqs=rows, num_sampled=rows, decode_context=rows * context,
                     decode_context_max=context)


def test_gpt_oss_prices_its_mxfp4_experts_from_the_measured_mxfp4_moe():
    tables = KernelTables.load("h100")
    model = kernel_cost_backend(resolve_model(GPT_OSS), hardware_spec("h100"), tables, 2)
    shapes = model.shapes
    mxfp4 = tables.moe("mxfp4", shapes.hidden_size, shapes.moe_intermediate_size,
                       shapes.num_experts, shapes.experts_per_token, 2, 1)
    assert model._moe(8) == mxfp4(8)
    # At a memory-bound batch the MXFP4 layer (13 MB an expert, 4 of 128 a token) beats a
    # measured 16-bit layer of a smaller shape (30 MB an expert, 6 of 128 a token).
    bf16 = tables.moe("bf16", 2688, 1856, 128, 6, 1, 1)
    assert tables.moe("mxfp4", 2880, 2880, 128, 4, 1, 1)(8) < bf16(8)


def test_gpt_oss_sliding_window_layers_stop_growing_past_the_window():
    """Half of gpt-oss's layers read at most 128 keys: past the window, decode attention
    grows at half the rate of a model whose every layer is full, and a long prefill's
    attention about halves."""
    tables, h100 = KernelTables.load("h100"), hardware_spec("h100")
    windowed = kernel_cost_backend(resolve_model(GPT_OSS), h100, tables, 2)
    full = kernel_cost_backend(replace(resolve_model(GPT_OSS), sliding_window=0,
                                       num_sliding_layers=0), h100, tables, 2)
    short = [m.predict(_decode(32, 100)) for m in (windowed, full)]
    assert short[0] == pytest.approx(short[1])  # within the window: the same reads
    growth = [m.predict(_decode(32, 16000)) - m.predict(_decode(32, 1000))
              for m in (windowed, full)]
    assert 0.4 < growth[0] / growth[1] < 0.6
    long = _prefill_plan(8192)
    ratio = windowed.prefill_attention_s(long) / full.prefill_attention_s(long)
    assert 0.45 < ratio < 0.6


def _prefill_plan(tokens: int) -> BatchPlan:
    return BatchPlan(prefill_tokens=tokens, prefill_seqs=1, num_sampled=1,
                     prefill_attn=tokens * tokens,
                     prefill_attn_causal=tokens * tokens - tokens * (tokens - 1) // 2)


def test_minimax_block_fp8_reads_the_measured_block_scaled_moe():
    spec = resolve_model(MINIMAX)
    assert spec.weight_block_size == 128
    deployment = build_deployment(DeploymentOptions(MINIMAX, "h100", tensor_parallel=4,
                                                    expert_parallel=True, cost="auto"))
    assert "vllm-kernels" in deployment.description
    assert "block-scaled fp8 GEMMs and MoE (128 x 128" in deployment.description


def test_minimax_q_k_norms_over_all_heads_all_reduce_under_tensor_parallel():
    spec, h100 = resolve_model(MINIMAX), hardware_spec("h100")
    per_head = replace(spec, qk_norm_across_heads=False)
    tp4 = gpu_cost_backend(spec, h100, tensor_parallel=4, expert_parallel=4)
    assert tp4.layer_s(64) > gpu_cost_backend(per_head, h100, 4, expert_parallel=4).layer_s(64)
    assert tp4.kernels_per_layer() == gpu_cost_backend(
        per_head, h100, 4, expert_parallel=4).kernels_per_layer() + 1
