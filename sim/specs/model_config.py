"""Models from Hugging Face config.json files: the ones servelab ships, or any path.

`resolve_model(text)` takes a preset name (sim.specs.model_specs), a Hugging Face id whose config
ships in sim/specs/models/, or a path to a config.json (or a folder holding one). Nothing is
fetched over the network. A config with a mechanism the cost model cannot price raises
UnsupportedModelError naming the field, never a silently wrong shape.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from sim.specs.model_mechanisms import (
    UnsupportedModelError,
    check_sliding,
    expert_quantization_of,
    gpt_oss_fields,
    minimax_fields,
    weight_block_size,
)
from sim.specs.model_specs import MODEL_SPECS, ModelSpec, default_head_dim

MODELS_DIR = Path(__file__).parent / "models"

# model_type values whose layers are priced: decoder blocks of RoPE attention with GQA (or
# DeepSeek's latent attention, or gpt-oss's alternating sliding-window and full attention)
# and a gated MLP, or that MLP replaced by routed experts.
SUPPORTED_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "gpt_oss", "kimi_k2", "llama", "llama4",
                         "llama4_text", "minimax_m2", "mistral", "mixtral", "qwen2", "qwen2_moe",
                         "qwen3", "qwen3_moe", "yi")
LLAMA4_TYPES = ("llama4", "llama4_text")
# Sliding-window layers named by layer_types, as many as full-attention ones (the grouping
# vLLM's hybrid KV cache manager pages exactly as sim.specs.model_specs sizes it).
SLIDING_TYPES = ("gpt_oss",)
DEEPSEEK_TYPES = ("deepseek_v2", "deepseek_v3", "kimi_k2")  # multi-head latent attention

# Fields whose presence (with a value that turns the mechanism on) names a mechanism the
# cost model prices only for the model types given, with the words the error uses. Llama 4's
# chunks (8,192 tokens) are priced as full attention, which the deployment line says.
_MECHANISM_FIELDS = (
    ("kv_lora_rank", "multi-head latent attention", DEEPSEEK_TYPES),
    ("q_lora_rank", "multi-head latent attention", DEEPSEEK_TYPES),
    ("linear_conv_kernel_dim", "linear attention", ()),
    ("full_attention_interval", "hybrid linear attention", ()),
    ("attention_chunk_size", "chunked local attention", LLAMA4_TYPES),
)


def resolve_model(text: str) -> ModelSpec:
    """A preset, a shipped Hugging Face id, or a config.json path (file or folder)."""
    if text in MODEL_SPECS:
        return MODEL_SPECS[text]
    shipped = shipped_configs()
    key = text.lower()
    if key in shipped:
        config = load_config(shipped[key])
        return spec_from_config(config, config["_name_or_path"])
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
    if path.is_file():
        return spec_from_config(load_config(path), str(text))
    presets = ", ".join(MODEL_SPECS)
    raise ValueError(f"unknown model preset {text!r}; known: {presets}; nor a Hugging Face id "
                     "servelab ships a config for (`servelab models` lists them), nor a "
                     "config.json path")


@cache
def shipped_configs() -> dict[str, Path]:
    """Lower-cased Hugging Face id and its short name (after the '/') -> shipped config."""
    index: dict[str, Path] = {}
    for path in sorted(MODELS_DIR.glob("*.json")):
        hf_id = load_config(path)["_name_or_path"]
        index[hf_id.lower()] = path
        index.setdefault(hf_id.split("/")[-1].lower(), path)
    return index


def shipped_model_ids() -> list[str]:
    """The Hugging Face ids servelab ships configs for, sorted."""
    return sorted(load_config(path)["_name_or_path"] for path in set(shipped_configs().values()))


def load_config(path: Path) -> dict[str, Any]:
    """A config.json as a dict; a clear error for an unreadable or non-object file."""
    try:
        config = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: cannot read a model config: {error}") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: a model config must be a JSON object")
    return config


def spec_from_config(config: dict[str, Any], name: str) -> ModelSpec:
    """The ModelSpec a Hugging Face config describes (text_config of a multimodal one)."""
    # (a multimodal config may keep it beside its text model's fields: Kimi-K2.5)
    quantized = config.get("quantization_config") or (
        config.get("text_config") or {}).get("quantization_config")
    # MXFP4 or int4 routed experts alone leave the other linear layers in the serving dtype.
    experts = expert_quantization_of(quantized, name)
    quantization, kv_cache_dtype = (None, None) if experts else _quantization(quantized, name)
    config = config.get("text_config") or config
    model_type = config.get("model_type")
    _check_priced(config, name, model_type)
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise UnsupportedModelError(f"{name}: model_type {model_type!r} is not priced; "
                                    f"supported: {', '.join(SUPPORTED_MODEL_TYPES)}")
    try:
        heads = int(config["num_attention_heads"])
        layers = int(config["num_hidden_layers"])
        # Llama 4 names its expert width intermediate_size and its dense MLP's apart.
        dense_width = config["intermediate_size_mlp" if model_type in LLAMA4_TYPES
                             else "intermediate_size"]
        # Each family's expert fields (and DeepSeek's attention, its head_dim among them).
        if model_type in LLAMA4_TYPES:
            family = _llama4_experts(config, layers)
        elif model_type in DEEPSEEK_TYPES:
            family = _deepseek_experts(config, layers) | _latent_attention(config)
        else:
            family = _experts(config, layers)
        return ModelSpec(
            name=name, hidden_size=int(config["hidden_size"]),
            intermediate_size=int(dense_width), num_layers=layers,
            num_heads=heads, num_kv_heads=int(config.get("num_key_value_heads") or heads),
            vocab_size=int(config["vocab_size"]),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            rope_theta=float(config.get("rope_theta", 10000.0)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=model_type in ("qwen2", "qwen2_moe") or bool(config.get("attention_bias")),
            head_dim=family.pop("head_dim", int(config.get("head_dim") or 0))
            or default_head_dim(name, int(config["hidden_size"]), heads),
            hidden_act=str(config.get("hidden_act", "silu")),
            # (Llama 4's L2 norm has no weights; MiniMax-M2 norms q and k over all heads)
            qk_norm=model_type in ("qwen3", "qwen3_moe") or bool(config.get("use_qk_norm")),
            attention_chunk_size=int(config.get("attention_chunk_size") or 0),
            quantization=quantization, kv_cache_dtype=kv_cache_dtype,
            weight_block_size=weight_block_size(quantized, quantization),
            expert_quantization=experts,
            **family, **gpt_oss_fields(config, name, model_type),
            **minimax_fields(config, model_type),
        )
    except KeyError as missing:
        raise ValueError(f"{name}: config.json lacks {missing.args[0]}") from None
    except (TypeError, ValueError) as error:
        raise ValueError(f"{name}: config.json: {error}") from None


def _check_priced(config: dict[str, Any], name: str, model_type: str | None) -> None:
    """Raise UnsupportedModelError naming the first field of a mechanism not priced."""
    for key, mechanism, priced_for in _MECHANISM_FIELDS:
        if config.get(key) and model_type not in priced_for:
            raise UnsupportedModelError(f"{name}: {key} ({mechanism}) is not supported by "
                                        "the cost model")
    layer_types = config.get("layer_types") or []
    priced = ("full_attention", "sliding_attention") if model_type in SLIDING_TYPES else (
        "full_attention",)
    other = sorted({t for t in layer_types if t not in priced})
    if other:
        raise UnsupportedModelError(f"{name}: layer_types {other} (attention other than full) "
                                    "is not supported by the cost model")
    if (model_type == "minimax_m2" and config.get("use_qk_norm")
            and config.get("qk_norm_type", "per_layer") != "per_layer"):
        raise UnsupportedModelError(f"{name}: qk_norm_type {config['qk_norm_type']!r} is not "
                                    "priced; per_layer (q and k over all heads) is")
    if model_type in SLIDING_TYPES:
        check_sliding(config, name, layer_types)
        return
    window = config.get("sliding_window")
    uses_window = config.get("use_sliding_window", True)
    max_pos = config.get("max_position_embeddings") or 0
    if window and uses_window and int(window) < int(max_pos):
        raise UnsupportedModelError(f"{name}: sliding_window={window} (sliding-window "
                                    "attention) is not supported by the cost model")


def _quantization(quantized: Any, name: str) -> tuple[str | None, str | None]:
    """What a checkpoint's quantization_config means, as vLLM loads it: the weights ("fp8"
    for FP8 weights, per-tensor or in blocks (weight_block_size): quant_method fp8, a
    ModelOpt FP8 checkpoint, or compressed-tensors with 8-bit float weights) and the KV
    cache it turns on under --kv-cache-dtype auto (ModelOpt's kv_cache_quant_algo FP8 gives
    fp8_e4m3, a compressed-tensors kv_cache_scheme of 8-bit floats fp8; quant_method fp8
    has none). Any other scheme but experts' own (expert_quantization_of, checked first) is
    refused by name, never priced as 16-bit weights."""
    if not quantized:
        return None, None
    method = quantized.get("quant_method", "?") if isinstance(quantized, dict) else "?"
    if method == "fp8":
        return "fp8", None
    if str(method).startswith("modelopt"):
        inner = quantized.get("quantization") or quantized
        if str(inner.get("quant_algo", "")).upper() == "FP8":
            kv = inner.get("kv_cache_scheme") or inner.get("kv_cache_quant_algo")
            return "fp8", _modelopt_kv(kv, name)
    if method == "compressed-tensors":
        groups = quantized.get("config_groups") or {}
        weights = [group.get("weights") or {} for group in groups.values()
                   if isinstance(group, dict)]
        if weights and all(_fp8_scheme(w) for w in weights):
            kv = quantized.get("kv_cache_scheme")
            if kv and not _fp8_scheme(kv):
                raise UnsupportedModelError(f"{name}: quantization_config kv_cache_scheme "
                                            f"{kv!r} is not priced; an FP8 KV cache is")
            return "fp8", "fp8" if kv else None
    raise UnsupportedModelError(f"{name}: quantization_config (quant_method {method!r}) is "
                                "not priced; FP8 weights are (quant_method fp8, modelopt "
                                "FP8, compressed-tensors FP8, or --quantization fp8 with the "
                                "unquantized model's config), and MXFP4 experts "
                                "(quant_method mxfp4) or int4 ones (compressed-tensors "
                                "W4A16)")


def _fp8_scheme(scheme: Any) -> bool:
    """A compressed-tensors tensor scheme of 8-bit floats."""
    return isinstance(scheme, dict) and scheme.get("type") == "float" \
        and scheme.get("num_bits") == 8


def _modelopt_kv(kv: Any, name: str) -> str | None:
    """The KV cache dtype a ModelOpt checkpoint's KV field gives (vLLM maps FP8 to
    fp8_e4m3); None when it names none."""
    if not kv:
        return None
    if (isinstance(kv, str) and kv.upper() == "FP8") or _fp8_scheme(kv):
        return "fp8_e4m3"
    raise UnsupportedModelError(f"{name}: quantization_config KV cache scheme {kv!r} is "
                                "not priced; an FP8 KV cache is")


def _latent_attention(config: dict[str, Any]) -> dict[str, int]:
    """The ModelSpec fields of DeepSeek's multi-head latent attention: a query's head_dim is
    its no-RoPE and RoPE parts together."""
    rope = int(config["qk_rope_head_dim"])
    return {"kv_lora_rank": int(config["kv_lora_rank"]),
            "q_lora_rank": int(config.get("q_lora_rank") or 0),
            "qk_rope_head_dim": rope, "v_head_dim": int(config["v_head_dim"]),
            "head_dim": int(config["qk_nope_head_dim"]) + rope}


def _deepseek_experts(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """The ModelSpec expert fields of a DeepSeek-V2/V3 config: n_shared_experts always-on
    experts (one ungated MLP of their summed width), the first first_k_dense_replace layers
    dense, an MoE layer every moe_layer_freq after them."""
    experts = int(config.get("n_routed_experts") or 0)
    if not experts:
        return {}
    width = int(config["moe_intermediate_size"])
    first = int(config.get("first_k_dense_replace") or 0)
    freq = int(config.get("moe_layer_freq") or 1)
    moe = sum(1 for i in range(first, layers) if i % freq == 0)
    return {
        "num_experts": experts,
        "num_experts_per_tok": int(config["num_experts_per_tok"]),
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": width * int(config.get("n_shared_experts") or 0),
        "shared_expert_gate": False,
        "num_dense_layers": layers - moe,
    }


def _llama4_experts(config: dict[str, Any], layers: int) -> dict[str, Any]:
    """The ModelSpec expert fields of a Llama 4 config: every MoE layer has a shared expert
    as wide as its routed ones (no gate); the others keep the dense MLP."""
    experts = int(config.get("num_local_experts") or 0)
    if not experts:
        return {}
    step = int(config.get("interleave_moe_layer_step") or 1)
    moe = config.get("moe_layers")
    moe = set(moe) if moe else set(range(step - 1, layers, step))
    width = int(config["intermediate_size"])
    return {
        "num_experts": experts,
        "num_experts_per_tok": int(config["num_experts_per_tok"]),
        "moe_intermediate_size": width,
        "shared_expert_intermediate_size": width,
        "shared_expert_gate": False,
        "num_dense_layers": layers - len(moe & set(range(layers))),
    }


def _experts(config: dict[str, Any], layers: int) -> dict[str, int]:
    """The ModelSpec expert fields of a Mixtral, Qwen2-MoE or Qwen3-MoE config."""
    experts = int(config.get("num_local_experts") or config.get("num_experts") or 0)
    if not experts:
        return {}
    dense = set(config.get("mlp_only_layers") or [])
    step = int(config.get("decoder_sparse_step") or 1)
    # Qwen-MoE: layer i has experts when (i + 1) % step == 0 and i is not in mlp_only_layers.
    dense |= {i for i in range(layers) if (i + 1) % step}
    dense |= set(range(int(config.get("first_k_dense_replace") or 0)))
    return {
        "num_experts": experts,
        "num_experts_per_tok": int(config["num_experts_per_tok"]),
        # Mixtral's experts are intermediate_size wide; Qwen-MoE names their width apart.
        "moe_intermediate_size": int(config.get("moe_intermediate_size")
                                     or config["intermediate_size"]),
        "shared_expert_intermediate_size": int(config.get("shared_expert_intermediate_size")
                                               or 0),
        "num_dense_layers": len(dense),
    }
