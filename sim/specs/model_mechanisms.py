"""The config fields of gpt-oss and MiniMax-M2 that their cost needs (gpt-oss's sliding-window
layers and MXFP4 experts, MiniMax-M2's q/k norms and block-FP8 scales), and what the cost
models approximate about them, for a deployment's line.
"""

from __future__ import annotations

import re
from typing import Any

from sim.specs.model_specs import ModelSpec


class UnsupportedModelError(ValueError):
    """A model config names a mechanism the cost model does not price."""


def check_sliding(config: dict[str, Any], name: str, layer_types: list[str]) -> None:
    """A sliding-window model is priced with a window on as many layers as full attention
    (sim.specs.model_specs.ModelSpec.kv_bytes_per_token), one per entry of layer_types."""
    sliding = layer_types.count("sliding_attention")
    if len(layer_types) != int(config.get("num_hidden_layers") or 0) or not config.get(
            "sliding_window"):
        raise UnsupportedModelError(f"{name}: sliding-window attention needs layer_types "
                                    "for every layer and a sliding_window")
    if sliding and 2 * sliding != len(layer_types):
        raise UnsupportedModelError(f"{name}: layer_types with {sliding} sliding-window "
                                    f"layers of {len(layer_types)}: only as many sliding as "
                                    "full-attention layers are priced")


# Modules an MXFP4 checkpoint must keep unquantized for its experts alone to be MXFP4 (the
# names of gpt-oss's modules_to_not_convert): attention, router, embedding, lm_head.
_MXFP4_KEPT = ("self_attn", "router", "embed_tokens", "lm_head")


# Modules an int4 compressed-tensors checkpoint must leave unquantized (its `ignore` list)
# for its routed experts alone to be int4, by their names in a DeepSeek-style layout
# (Kimi-K2's): attention, shared experts, a dense layer's MLP, the LM head; and a routed
# expert's, which it must quantize.
_INT4_KEPT = {"attention": "model.layers.0.self_attn.q_a_proj",
              "shared experts": "model.layers.3.mlp.shared_experts.gate_proj",
              "dense MLP": "model.layers.0.mlp.gate_proj", "lm_head": "lm_head"}
_ROUTED_EXPERT = "model.layers.3.mlp.experts.0.gate_proj"


def _ignored(module: str, ignore: list) -> bool:
    """Whether a compressed-tensors `ignore` entry (a name, or "re:" and a regex) names it."""
    for entry in ignore:
        entry = str(entry)
        if entry.startswith("re:") and re.match(entry[3:], module):
            return True
        if module == entry or module.endswith("." + entry):
            return True
    return False


def _int4_experts(quantized: dict, name: str) -> bool:
    """Whether a compressed-tensors checkpoint quantizes its routed experts alone to 4-bit
    integers, weight-only in groups of 32 (vLLM runs them with 16-bit GEMMs, Marlin MoE);
    an int4 scheme beyond that is refused by name."""
    if quantized.get("quant_method") != "compressed-tensors":
        return False
    groups = [g for g in (quantized.get("config_groups") or {}).values() if isinstance(g, dict)]
    weights = [g.get("weights") or {} for g in groups]
    if not weights or not all(w.get("type") == "int" and w.get("num_bits") == 4
                              for w in weights):
        return False
    if any(g.get("input_activations") for g in groups) or not all(
            w.get("strategy") == "group" and w.get("group_size") == 32 for w in weights):
        raise UnsupportedModelError(f"{name}: quantization_config int4 other than weight-only "
                                    "in groups of 32 (W4A16) is not priced")
    ignore = quantized.get("ignore") or []
    quantized_too = [what for what, module in _INT4_KEPT.items()
                     if not _ignored(module, ignore)]
    if quantized_too or _ignored(_ROUTED_EXPERT, ignore):
        raise UnsupportedModelError(
            f"{name}: quantization_config int4 on {', '.join(quantized_too) or 'no experts'} "
            "is not priced; int4 routed experts are")
    return True


def expert_quantization_of(quantized: Any, name: str) -> str | None:
    """"mxfp4" for a checkpoint whose routed experts alone are MXFP4 (gpt-oss), "int4" for
    one whose routed experts alone are 4-bit integers (Kimi-K2); None for any other. Either
    format on other modules is refused by name."""
    if not isinstance(quantized, dict):
        return None
    if _int4_experts(quantized, name):
        return "int4"
    if quantized.get("quant_method") != "mxfp4":
        return None
    kept = " ".join(quantized.get("modules_to_not_convert") or [])
    missing = [module for module in _MXFP4_KEPT if module not in kept]
    if missing:
        raise UnsupportedModelError(f"{name}: quantization_config mxfp4 on {', '.join(missing)}"
                                    " is not priced; MXFP4 routed experts are")
    return "mxfp4"


def weight_block_size(quantized: Any, quantization: str | None) -> int:
    """The square block an FP8 checkpoint's weight scales cover (0: per-tensor)."""
    if quantization != "fp8" or not isinstance(quantized, dict):
        return 0
    block = quantized.get("weight_block_size") or [0]
    return int(block[0])


def gpt_oss_fields(config: dict[str, Any], name: str, model_type: str | None) -> dict[str, Any]:
    """gpt-oss's fields: MXFP4 experts, windowed layers, attention sinks, its biases."""
    if model_type != "gpt_oss":
        return {}
    layer_types = config.get("layer_types") or []
    sliding = layer_types.count("sliding_attention")
    return {"sliding_window": int(config["sliding_window"]) if sliding else 0,
            "num_sliding_layers": sliding, "attention_sinks": True, "o_bias": True,
            "expert_bias": True}


def minimax_fields(config: dict[str, Any], model_type: str | None) -> dict[str, Any]:
    """MiniMax-M2's q/k norms over all heads at once (qk_norm_type per_layer)."""
    if model_type != "minimax_m2" or not config.get("use_qk_norm"):
        return {}
    return {"qk_norm_across_heads": True}


def pricing_notes(spec: ModelSpec) -> list[str]:
    """What the cost models approximate about `spec`'s mechanisms, for a deployment's line."""
    notes = []
    if spec.sliding_window:
        notes.append(
            f"{spec.num_sliding_layers} sliding-window layers ({spec.sliding_window} tokens) "
            "read min(sum of contexts, rows x window) of KV and pair min(pairs, prefill tokens "
            "x window) from a step's totals (exact once every row's context passes the "
            "window); KV pool sized by the full-attention layers' bytes a token, each "
            "sequence's window blocks not held")
    if spec.attention_sinks:
        notes.append("attention sinks (a learned logit a head) add negligible work: not priced")
    if spec.expert_quantization == "mxfp4":
        notes.append(f"{spec.expert_quantization} experts weight-only: "
                     f"{spec.expert_weight_bytes(2) * 8:g}-bit weights read, 16-bit GEMMs "
                     "(vLLM's Hopper path; on GPUs with fp4 tensor cores, B200 among them, "
                     "extrapolated: no GPU file gives an fp4 peak)")
    elif spec.expert_quantization:
        notes.append(f"{spec.expert_quantization} experts weight-only: "
                     f"{spec.expert_weight_bytes(2) * 8:g}-bit weights read, 16-bit GEMMs "
                     "(vLLM's Marlin MoE kernels)")
    return notes
