"""What the fitted GPU cost model needs of a model and a GPU: layer shapes and datasheet peaks.

Kept narrow on purpose: `LayerShapes.from_model_spec` adapts servelab's ModelSpec, and a GPU is
its HardwareSpec as the GPU file gives it (`GpuPeaks` names what the model reads of it); the
models the fitted data and its validation name (BLOOM-176B among them, which servelab does not
ship) are listed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sim.specs.hardware import HardwareSpec, hardware_spec
from sim.specs.model_specs import ModelSpec


@dataclass(frozen=True)
class LayerShapes:
    """One decoder's shapes, whole model (not per GPU)."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int  # dense MLP width (0 when every layer is MoE)
    vocab_size: int
    gated_mlp: bool = True  # SwiGLU: gate and up projections (Llama, Qwen); False: GELU MLP
    qk_norm: bool = False  # Qwen3 normalises q and k per head
    rope: bool = True  # rotary position embedding (BLOOM: ALiBi, no kernel of its own)
    # Llama-family engines fuse the residual add into RMSNorm; BLOOM-style LayerNorm blocks
    # add the residual, and row-parallel biases, in kernels of their own.
    fused_add_norm: bool = True
    num_experts: int = 0  # routed experts per MoE layer; 0: a dense model
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    # An always-on expert beside the routed ones (Qwen2-MoE: a gated MLP this wide, and a
    # one-output gate that scales it); 0: none.
    shared_expert_intermediate_size: int = 0
    num_dense_layers: int = 0  # layers of an MoE model with a dense MLP instead of experts
    shared_expert_gate: bool = True  # the shared expert's output scaled by a gate (Qwen2-MoE)
    # Multi-head latent attention (sim.specs.model_specs.ModelSpec; 0: none).
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # Routed experts' own weight format (gpt-oss: "mxfp4", ModelSpec.expert_quantization).
    expert_quantization: str | None = None
    # Layers attending to the last sliding_window positions only (gpt-oss; 0: none).
    sliding_window: int = 0
    num_sliding_layers: int = 0
    # q and k normalised over all heads at once (MiniMax-M2): under tensor parallelism the
    # GPUs all-reduce each row's sums of squares before scaling.
    qk_norm_across_heads: bool = False
    weight_block_size: int = 0  # FP8 weights' scale blocks (0: per-tensor scales)

    def __post_init__(self) -> None:
        for key in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                    "vocab_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"model {self.name}: {key} must be >= 1")
        if self.num_experts and not 0 < self.experts_per_token <= self.num_experts:
            raise ValueError(f"model {self.name}: experts_per_token must be in "
                             f"[1, num_experts={self.num_experts}]")
        if (not self.num_experts or self.num_dense_layers) and self.intermediate_size < 1:
            raise ValueError(f"model {self.name}: a dense MLP needs intermediate_size >= 1")
        if self.shared_expert_intermediate_size < 0:
            raise ValueError(f"model {self.name}: shared_expert_intermediate_size must be >= 0")
        if self.num_dense_layers and not (self.num_experts
                                          and 0 < self.num_dense_layers < self.num_layers):
            raise ValueError(f"model {self.name}: num_dense_layers must be in "
                             f"[0, num_layers={self.num_layers}) of an MoE model")

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers if self.num_experts else 0

    @classmethod
    def from_model_spec(cls, spec: ModelSpec) -> LayerShapes:
        """The shapes of a servelab ModelSpec."""
        head_dim = spec.head_dim or spec.hidden_size // spec.num_heads
        return cls(spec.name, spec.num_layers, spec.hidden_size, spec.num_heads,
                   spec.num_kv_heads, head_dim, spec.intermediate_size, spec.vocab_size,
                   gated_mlp=spec.hidden_act in ("silu", "swiglu"), qk_norm=spec.qk_norm,
                   num_experts=spec.num_experts, experts_per_token=spec.num_experts_per_tok,
                   moe_intermediate_size=spec.moe_intermediate_size,
                   shared_expert_intermediate_size=spec.shared_expert_intermediate_size,
                   num_dense_layers=spec.num_dense_layers,
                   shared_expert_gate=spec.shared_expert_gate,
                   kv_lora_rank=spec.kv_lora_rank, q_lora_rank=spec.q_lora_rank,
                   qk_rope_head_dim=spec.qk_rope_head_dim, v_head_dim=spec.v_head_dim,
                   expert_quantization=spec.expert_quantization,
                   sliding_window=spec.sliding_window,
                   num_sliding_layers=spec.num_sliding_layers,
                   qk_norm_across_heads=spec.qk_norm_across_heads,
                   weight_block_size=spec.weight_block_size)


class GpuPeaks(Protocol):
    """What the fitted model reads of a GPU: a HardwareSpec (sim.specs.hardware), the one type
    for a GPU, has every field; this names the ones it scales its efficiencies by."""

    name: str
    peak_flops: float  # dense bf16 tensor FLOP/s (fp32 accumulate), no sparsity
    mem_bandwidth_bytes_s: float
    interconnect_bytes_s: float  # GPU-to-GPU, one direction (NVLink, else PCIe)
    host_link_bytes_s: float  # GPU to host memory, one direction (KV swapped out and in)
    allreduce: tuple[tuple[int, float, float], ...]  # measured: (GPUs, latency_s, bus B/s)
    peak_fp8_flops: float | None  # dense FP8 tensor FLOP/s; None: no FP8 tensor cores
    max_gpus: int  # GPUs of one node (its NVLink domain)
    network_bytes_s: float | None  # one GPU's share of the network to other nodes, one way
    network_latency_s: float | None  # one hop over that network


# Published config.json facts of the models the fitted data and its validation use.
KNOWN_SHAPES: dict[str, LayerShapes] = {s.name: s for s in (
    LayerShapes("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000),
    LayerShapes("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000),
    LayerShapes("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    LayerShapes("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256),
    LayerShapes("llama-3-70b", 80, 8192, 64, 8, 128, 28672, 128256),
    # bigscience/bloom: 4h GELU MLP, ALiBi (no RoPE), 250,880-token vocabulary.
    LayerShapes("bloom-176b", 70, 14336, 112, 112, 128, 57344, 250880, gated_mlp=False,
                rope=False, fused_add_norm=False),
    LayerShapes("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936, qk_norm=True),
    LayerShapes("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 0, 151936, qk_norm=True,
                num_experts=128, experts_per_token=8, moe_intermediate_size=768),
)}

def known_shapes(name: str) -> LayerShapes:
    """A model the fitted data or its validation names, by servelab's lower-case name."""
    try:
        return KNOWN_SHAPES[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r} for the GPU cost model; known: "
                         f"{', '.join(KNOWN_SHAPES)}") from None


def known_gpu(name: str) -> HardwareSpec:
    """A GPU by preset name, from its hardware file (sim/specs/gpus/)."""
    return hardware_spec(name)
