"""Models from config.json: shipped configs against published parameter counts, KV bytes by
hand, paths, and the mechanisms the cost model refuses by field name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.specs.model_config import (
    MODELS_DIR,
    UnsupportedModelError,
    resolve_model,
    shipped_model_ids,
    spec_from_config,
)

# Parameter counts the models' Hugging Face pages publish (safetensors totals).
PUBLISHED_PARAMS = {
    "meta-llama/Llama-2-7b-hf": 6_738_415_616,
    "meta-llama/Llama-2-13b-hf": 13_015_864_320,
    "meta-llama/Llama-2-70b-hf": 68_976_648_192,
    "codellama/CodeLlama-34b-hf": 33_743_970_304,
    "meta-llama/Meta-Llama-3-8B": 8_030_261_248,
    "meta-llama/Meta-Llama-3-70B": 70_553_706_496,
    "meta-llama/Llama-3.1-8B": 8_030_261_248,
    "meta-llama/Llama-3.1-70B": 70_553_706_496,
    "meta-llama/Llama-3.1-8B-Instruct": 8_030_261_248,
    "meta-llama/Llama-3.1-70B-Instruct": 70_553_706_496,
    "meta-llama/Llama-3.3-70B-Instruct": 70_553_706_496,
    "mistralai/Mistral-7B-v0.3": 7_248_023_552,
    "mistralai/Mistral-Nemo-Instruct-2407": 12_247_782_400,
    "mistralai/Mixtral-8x7B-v0.1": 46_702_792_704,
    "mistralai/Mixtral-8x22B-v0.1": 140_630_071_296,
    "Qwen/Qwen2.5-7B": 7_615_616_512,
    "Qwen/Qwen2.5-7B-Instruct": 7_615_616_512,
    "Qwen/Qwen2.5-72B": 72_706_203_648,
    "Qwen/Qwen3-8B": 8_190_735_360,
    "Qwen/Qwen3-32B": 32_762_123_264,
    "Qwen/Qwen3-30B-A3B": 30_532_122_624,
    "Qwen/Qwen3-30B-A3B-Instruct-2507": 30_532_122_624,
    "Qwen/Qwen3-235B-A22B": 235_093_634_560,
    "Qwen/Qwen3-235B-A22B-FP8": 235_093_634_560,  # (the same weights, in one byte)
    # Qwen2-MoE, with a shared expert beside the routed ones (model cards: 14.3B, 57.4B).
    "Qwen/Qwen1.5-MoE-A2.7B": 14_300_000_000,
    "Qwen/Qwen2-57B-A14B": 57_400_000_000,
    # Llama 4 Scout's model card: 109B, its vision encoder included (servelab prices the
    # text model, 107.8B: TOLERANCE below).
    "meta-llama/Llama-4-Scout-17B-16E": 109_000_000_000,
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": 109_000_000_000,
    # DeepSeek (multi-head latent attention): the main model, without the MTP module.
    "deepseek-ai/DeepSeek-V3": 671_000_000_000,
    "deepseek-ai/DeepSeek-R1": 671_000_000_000,
    "deepseek-ai/DeepSeek-V2-Lite": 15_700_000_000,
    "01-ai/Yi-34B": 34_388_917_248,
    # gpt-oss-120b's model card: 116.83B (its biases and attention sinks included).
    "openai/gpt-oss-120b": 116_830_000_000,
    # MiniMax-M2.5's model card: "230B total" (vLLM loads no MTP module: not counted).
    "MiniMaxAI/MiniMax-M2.5": 230_000_000_000,
    # Kimi-K2.5's model card: "1T" total (rounded; its vision tower is not priced).
    "moonshotai/Kimi-K2.5": 1_000_000_000_000,
}

# K and V bytes per token in bf16: 2 (K, V) x layers x KV heads x head_dim x 2 bytes.
KV_BYTES_BF16 = {
    "meta-llama/Llama-2-7b-hf": 2 * 32 * 32 * 128 * 2,
    "meta-llama/Meta-Llama-3-8B": 2 * 32 * 8 * 128 * 2,
    "meta-llama/Llama-3.1-70B": 2 * 80 * 8 * 128 * 2,
    "Qwen/Qwen2.5-7B": 2 * 28 * 4 * 128 * 2,
    "Qwen/Qwen3-32B": 2 * 64 * 8 * 128 * 2,  # head_dim 128 though hidden/heads is 80
    "mistralai/Mixtral-8x7B-v0.1": 2 * 32 * 8 * 128 * 2,
    "Qwen/Qwen3-30B-A3B": 2 * 48 * 4 * 128 * 2,
    "Qwen/Qwen3-235B-A22B": 2 * 94 * 4 * 128 * 2,
    "Qwen/Qwen2-57B-A14B": 2 * 28 * 4 * 128 * 2,
    "mistralai/Mistral-Nemo-Instruct-2407": 2 * 40 * 8 * 128 * 2,  # head_dim 128, not 160
    "meta-llama/Llama-4-Scout-17B-16E": 2 * 48 * 8 * 128 * 2,
    # MLA: one latent (512) and one RoPE key (64) per token and layer, for all heads.
    "deepseek-ai/DeepSeek-V3": 61 * (512 + 64) * 2,
    "deepseek-ai/DeepSeek-V2-Lite": 27 * (512 + 64) * 2,
    # gpt-oss: the pool holds the 18 full-attention layers' K and V a token (the 18
    # sliding-window layers' window comes on top, sim.specs.model_specs).
    "openai/gpt-oss-120b": 2 * 18 * 8 * 64 * 2,
    "MiniMaxAI/MiniMax-M2.5": 2 * 62 * 8 * 128 * 2,
    "moonshotai/Kimi-K2.5": 61 * (512 + 64) * 2,
}
TOLERANCE = {"meta-llama/Llama-4-Scout-17B-16E": 0.02,
             "meta-llama/Llama-4-Scout-17B-16E-Instruct": 0.02,
             "moonshotai/Kimi-K2.5": 0.03}


def test_every_issue_model_ships() -> None:
    assert set(shipped_model_ids()) == set(PUBLISHED_PARAMS)


@pytest.mark.parametrize("hf_id", sorted(PUBLISHED_PARAMS))
def test_weights_match_the_published_parameter_count(hf_id: str) -> None:
    spec = resolve_model(hf_id)
    assert spec.num_params == pytest.approx(PUBLISHED_PARAMS[hf_id],
                                            rel=TOLERANCE.get(hf_id, 0.01))


@pytest.mark.parametrize("hf_id", sorted(KV_BYTES_BF16))
def test_kv_bytes_per_token_by_hand(hf_id: str) -> None:
    assert resolve_model(hf_id).kv_bytes_per_token(2) == KV_BYTES_BF16[hf_id]


@pytest.mark.parametrize(("hf_id", "active"), [
    ("mistralai/Mixtral-8x7B-v0.1", 12.9e9),  # "12.9B active parameters"
    ("mistralai/Mixtral-8x22B-v0.1", 39e9),  # "39B active"
    ("Qwen/Qwen3-235B-A22B", 22e9),  # "22B activated"
    ("Qwen/Qwen1.5-MoE-A2.7B", 2.7e9),  # "2.7B activated"
])
def test_moe_active_parameters_match_the_model_cards(hf_id: str, active: float) -> None:
    assert resolve_model(hf_id).num_active_params == pytest.approx(active, rel=0.01)


def test_short_names_and_case_resolve_to_the_shipped_config() -> None:
    assert resolve_model("Llama-3.1-8B") == resolve_model("meta-llama/Llama-3.1-8B")
    assert resolve_model("qwen/qwen3-8b").num_layers == 36


@pytest.mark.parametrize("hf_id", ["meta-llama/Llama-3.1-8B", "Qwen/Qwen2.5-7B",
                                   "Qwen/Qwen3-8B", "mistralai/Mistral-7B-v0.3",
                                   "mistralai/Mixtral-8x7B-v0.1", "Qwen/Qwen3-30B-A3B"])
def test_a_config_json_path_or_its_folder_gives_the_shipped_shape(tmp_path: Path,
                                                                  hf_id: str) -> None:
    shipped = json.loads((MODELS_DIR / (hf_id.replace("/", "--") + ".json")).read_text())
    (tmp_path / "config.json").write_text(json.dumps(shipped))
    by_file = resolve_model(str(tmp_path / "config.json"))
    by_folder = resolve_model(str(tmp_path))
    assert by_file.num_params == by_folder.num_params == resolve_model(hf_id).num_params


DEEPSEEK_V3 = {  # deepseek-ai/DeepSeek-V3 config.json, the fields that matter here
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
    "num_hidden_layers": 61, "num_attention_heads": 128, "num_key_value_heads": 128,
    "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "vocab_size": 129280, "max_position_embeddings": 163840,
}


@pytest.mark.parametrize(("changes", "field"), [
    ({"model_type": "llama"}, "kv_lora_rank"),  # latent attention outside DeepSeek's types
    ({"model_type": "mistral", "kv_lora_rank": None, "q_lora_rank": None,
      "sliding_window": 4096, "max_position_embeddings": 32768}, "sliding_window"),
    ({"model_type": "qwen3_next", "kv_lora_rank": None, "q_lora_rank": None,
      "layer_types": ["linear_attention", "full_attention"]}, "layer_types"),
    ({"model_type": "gpt2", "kv_lora_rank": None, "q_lora_rank": None}, "model_type"),
    ({"model_type": "llama", "kv_lora_rank": None, "q_lora_rank": None,
      "quantization_config": {"quant_method": "awq"}}, "quantization_config.*awq"),
])
def test_unpriced_mechanisms_are_refused_by_field_name(changes: dict, field: str) -> None:
    with pytest.raises(UnsupportedModelError, match=field):
        spec_from_config({**DEEPSEEK_V3, **changes}, "m")


def test_qwen2_sliding_window_switched_off_is_priced() -> None:
    spec = resolve_model("Qwen/Qwen2.5-7B")  # sliding_window set, use_sliding_window false
    assert spec.num_layers == 28


def test_a_config_missing_a_field_names_it(tmp_path: Path) -> None:
    config = json.loads((MODELS_DIR / "Qwen--Qwen3-8B.json").read_text())
    del config["num_hidden_layers"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="num_hidden_layers"):
        resolve_model(str(tmp_path))


def test_unknown_model_names_the_presets() -> None:
    with pytest.raises(ValueError, match="unknown model preset 'gpt-5'.*llama-3-8b"):
        resolve_model("gpt-5")


def test_llama4_reads_its_own_names_for_experts_and_dense_layers() -> None:
    """Llama 4: intermediate_size is the expert width, intermediate_size_mlp the dense
    MLP's; every MoE layer adds an ungated shared expert as wide as a routed one; layers
    off interleave_moe_layer_step keep the dense MLP (Maverick: every other one)."""
    scout = resolve_model("meta-llama/Llama-4-Scout-17B-16E")
    assert (scout.num_experts, scout.num_experts_per_tok, scout.num_dense_layers) == (16, 1, 0)
    assert scout.moe_intermediate_size == scout.shared_expert_intermediate_size == 8192
    assert not scout.shared_expert_gate and scout.attention_chunk_size == 8192
    assert scout.num_active_params == pytest.approx(17e9, rel=0.02)  # "17B active"
    config = json.loads((MODELS_DIR / "meta-llama--Llama-4-Scout-17B-16E.json").read_text())
    text = config["text_config"]
    del text["moe_layers"]
    text.update(interleave_moe_layer_step=2, num_local_experts=128)  # Maverick's MoE
    maverick = spec_from_config(config, "maverick")
    assert maverick.num_dense_layers == 24 and maverick.intermediate_size == 16384
    assert maverick.num_params == pytest.approx(400e9, rel=0.01)  # "400B total"
    assert maverick.num_active_params == pytest.approx(17e9, rel=0.02)  # "17B active"


def test_deepseek_reads_latent_attention_and_its_experts() -> None:
    """DeepSeek-V3: a query's head_dim is its no-RoPE part and RoPE part (128 + 64); one
    ungated shared expert of moe_intermediate_size; the first three layers dense; its FP8
    checkpoint read as FP8 weights, as vLLM loads it."""
    spec = resolve_model("deepseek-ai/DeepSeek-V3")
    assert spec.is_mla and (spec.head_dim, spec.v_head_dim, spec.q_lora_rank) == (192, 128, 1536)
    assert (spec.num_experts, spec.num_experts_per_tok, spec.num_dense_layers) == (256, 8, 3)
    assert spec.shared_expert_intermediate_size == 2048 and not spec.shared_expert_gate
    assert spec.quantization == "fp8" and spec.intermediate_size == 18432
    assert spec.num_active_params == pytest.approx(37e9, rel=0.02)  # "37B activated"
    lite = resolve_model("deepseek-ai/DeepSeek-V2-Lite")  # no q bottleneck, 2 shared experts
    assert lite.q_lora_rank == 0 and lite.shared_expert_intermediate_size == 2 * 1408
    assert lite.quantization is None


def test_compressed_tensors_fp8_checkpoints_are_fp8_weights() -> None:
    config = json.loads((MODELS_DIR / "meta-llama--Llama-3.1-8B.json").read_text())
    config["quantization_config"] = {"quant_method": "compressed-tensors", "config_groups": {
        "group_0": {"weights": {"num_bits": 8, "type": "float"}}}}
    assert spec_from_config(config, "m").quantization == "fp8"
    config["quantization_config"]["config_groups"]["group_0"]["weights"]["type"] = "int"
    with pytest.raises(UnsupportedModelError, match="compressed-tensors"):
        spec_from_config(config, "m")
