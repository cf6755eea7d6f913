"""The config fields of gpt-oss and MiniMax-M2 that their cost needs (gpt-oss's sliding-window
layers and MXFP4 experts, MiniMax-M2's q/k norms and block-FP8 scales), and what the cost
models approximate about them, for a deployment's line.
"""

from __future__ import annotations

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


def expert_quantization_of(quantized: Any, name: str) -> str | None:
    """"mxfp4" for a checkpoint whose routed experts alone are MXFP4 (gpt-oss); None for
    any other. MXFP4 on other modules is refused by name."""
    if not isinstance(quantized, dict) or quantized.get("quant_method") != "mxfp4":
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
    return {"expert_quantization": expert_quantization_of(config.get("quantization_config"),
                                                        name),
            "sliding_window": int(config["sliding_window"]) if sliding else 0,
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
    if spec.expert_quantization:
        notes.append(f"{spec.expert_quantization} experts weight-only: "
                     f"{spec.expert_weight_bytes(2) * 8:g}-bit weights read, 16-bit GEMMs "
                     "(vLLM's Hopper path; on GPUs with fp4 tensor cores, B200 among them, "
                     "extrapolated: no GPU file gives an fp4 peak)")
    return notes
