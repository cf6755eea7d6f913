"""Transformer shapes as plain data, shared by the cost models (sim) and the executor.

Numbers come from each model's published config.json on its Hugging Face model card.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelSpec:
    """A Llama-family decoder's shape; enough to size weights, KV and FLOPs."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    vocab_size: int
    max_position_embeddings: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = False
    qkv_bias: bool = False  # Qwen2 adds biases to q/k/v projections

    def __post_init__(self) -> None:
        for key in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                    "num_kv_heads", "vocab_size", "max_position_embeddings"):
            if getattr(self, key) < 1:
                raise ValueError(f"model {self.name}: {key} must be >= 1")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"model {self.name}: hidden_size not divisible by num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"model {self.name}: num_heads not divisible by num_kv_heads")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def num_params(self) -> int:
        """Parameter count (embeddings and lm_head counted once if tied)."""
        h, kv = self.hidden_size, self.num_kv_heads * self.head_dim
        attn = h * h * 2 + h * kv * 2 + (h + 2 * kv if self.qkv_bias else 0)
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * per_layer + embed + h

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Bytes of K and V one token occupies across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


MODEL_SPECS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        # Fast CPU tests; vocab covers the byte-level tokenizer (256 bytes + specials).
        ModelSpec("tiny", 64, 176, 2, 4, 2, 320, 1024),
        # The peer workload model of the executor benchmark (44.6M parameters).
        ModelSpec("peer-45m", 512, 1408, 4, 8, 4, 32000, 2048),
        # Qwen/Qwen2.5-0.5B config.json.
        ModelSpec("qwen2.5-0.5b", 896, 4864, 24, 14, 2, 151936, 32768, rms_norm_eps=1e-6,
                  rope_theta=1000000.0, tie_word_embeddings=True, qkv_bias=True),
        # meta-llama/Meta-Llama-3-8B config.json.
        ModelSpec("llama-3-8b", 4096, 14336, 32, 32, 8, 128256, 8192,
                  rope_theta=500000.0),
        # meta-llama/Meta-Llama-3-70B config.json.
        ModelSpec("llama-3-70b", 8192, 28672, 80, 64, 8, 128256, 8192,
                  rope_theta=500000.0),
    )
}


def model_spec(name: str) -> ModelSpec:
    """Look up a preset by name, with the list of known names in the error."""
    try:
        return MODEL_SPECS[name]
    except KeyError:
        known = ", ".join(MODEL_SPECS)
        raise ValueError(f"unknown model preset {name!r}; known: {known}") from None
