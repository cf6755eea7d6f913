"""ModelArgs: the executor's transformer shape, built from a sim ModelSpec or an HF config.json."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sim.specs.model_specs import ModelSpec, default_head_dim, model_spec

# HF `architectures` entries this executor runs: all Llama-family decoders.
SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
ROPE_TYPES = ("default", "linear", "llama3")


class UnsupportedModelError(ValueError):
    """A checkpoint whose architecture or options this executor does not implement."""


@dataclass(frozen=True)
class RopeScaling:
    """Rotary frequency scaling: `linear` divides positions, `llama3` stretches low freqs."""

    rope_type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3 only
    high_freq_factor: float = 4.0  # llama3 only
    original_max_position_embeddings: int = 8192  # llama3 only

    def __post_init__(self) -> None:
        if self.rope_type not in ROPE_TYPES:
            raise UnsupportedModelError(
                f"rope_scaling type {self.rope_type!r} is not supported; use one of {ROPE_TYPES}"
            )
        if self.factor <= 0:
            raise ValueError(f"rope_scaling factor must be > 0, got {self.factor}")


@dataclass(frozen=True)
class ModelArgs:
    """A Llama-family decoder: RMSNorm, RoPE, GQA, SwiGLU, optional q/k/v biases (Qwen2)."""

    dim: int  # hidden size
    n_layers: int
    n_heads: int
    n_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int
    head_dim: int  # a query head's width (default_head_dim: dim // n_heads)
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    tie_word_embeddings: bool = False
    qkv_bias: bool = False
    sliding_window: int | None = None  # Mistral v0.1: attend to the last N positions only
    name: str = "custom"

    def __post_init__(self) -> None:
        for key in ("dim", "n_layers", "n_heads", "n_kv_heads", "intermediate_size",
                    "vocab_size", "max_position_embeddings"):
            if getattr(self, key) < 1:
                raise ValueError(f"model {self.name}: {key} must be >= 1, got {getattr(self, key)}")
        if self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(f"model {self.name}: head_dim must be even, got {self.head_dim}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"model {self.name}: n_heads not divisible by n_kv_heads")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"model {self.name}: sliding_window must be >= 1")

    @property
    def group_size(self) -> int:
        """Query heads sharing one K/V head."""
        return self.n_heads // self.n_kv_heads

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> ModelArgs:
        """The shape of a sim ModelSpec (the presets the cost models use)."""
        return cls(
            dim=spec.hidden_size, n_layers=spec.num_layers, n_heads=spec.num_heads,
            n_kv_heads=spec.num_kv_heads, intermediate_size=spec.intermediate_size,
            vocab_size=spec.vocab_size, max_position_embeddings=spec.max_position_embeddings,
            head_dim=spec.head_dim, rms_norm_eps=spec.rms_norm_eps, rope_theta=spec.rope_theta,
            tie_word_embeddings=spec.tie_word_embeddings, qkv_bias=spec.qkv_bias, name=spec.name,
        )

    @classmethod
    def from_preset(cls, name: str) -> ModelArgs:
        """A MODEL_SPECS preset by name (tiny, peer-45m, qwen2.5-0.5b, llama-3-8b, ...)."""
        return cls.from_spec(model_spec(name))

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], name: str = "hf") -> ModelArgs:
        """Parse a Hugging Face config.json dict of a supported architecture."""
        archs = config.get("architectures") or [config.get("model_type", "<missing>")]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModelError(
                f"{name}: architecture {arch!r} is not supported; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise UnsupportedModelError(f"{name}: hidden_act {act!r} is not supported (silu only)")
        if config.get("mlp_bias"):
            raise UnsupportedModelError(f"{name}: mlp_bias is not supported")
        # transformers 5 nests rope_theta and the scaling in rope_parameters; 4.x keeps
        # rope_theta at the top level and the scaling in rope_scaling.
        rope = {**(config.get("rope_parameters") or {}), **(config.get("rope_scaling") or {})}
        try:
            n_heads = int(config["num_attention_heads"])
            return cls(
                dim=int(config["hidden_size"]), n_layers=int(config["num_hidden_layers"]),
                n_heads=n_heads, n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
                intermediate_size=int(config["intermediate_size"]),
                vocab_size=int(config["vocab_size"]),
                max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
                head_dim=int(config.get("head_dim") or 0)
                or default_head_dim(name, int(config["hidden_size"]), n_heads),
                rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
                rope_theta=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
                rope_scaling=_rope_scaling(rope, name),
                tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
                qkv_bias=arch == "Qwen2ForCausalLM" or bool(config.get("attention_bias", False)),
                sliding_window=_sliding_window(config, arch, name),
                name=name,
            )
        except KeyError as exc:
            raise ValueError(f"{name}: config.json lacks required key {exc.args[0]!r}") from None


def _rope_scaling(value: dict[str, Any] | None, name: str) -> RopeScaling:
    if not value:
        return RopeScaling()
    rope_type = value.get("rope_type", value.get("type", "default"))
    if rope_type not in ROPE_TYPES:
        raise UnsupportedModelError(
            f"{name}: rope_scaling type {rope_type!r} is not supported; use one of {ROPE_TYPES}"
        )
    keys = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
    extra = {key: value[key] for key in keys if key in value}
    return RopeScaling(rope_type=rope_type, factor=float(value.get("factor", 1.0)), **extra)


def _sliding_window(config: dict[str, Any], arch: str, name: str) -> int | None:
    window = config.get("sliding_window")
    if arch == "Qwen2ForCausalLM":
        if config.get("use_sliding_window"):
            raise UnsupportedModelError(f"{name}: Qwen2 use_sliding_window is not supported")
        return None
    if arch == "LlamaForCausalLM":
        return None
    return int(window) if window else None
