"""Analytic roofline cost model: one step's time from model shapes and a GPU's datasheet peaks.

step_s = max(FLOPs / achieved FLOP/s, bytes moved / achieved bandwidth) + per-step overhead,
with every coefficient precomputed so `predict` is a few multiply-adds (it runs per step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.core import BatchPlan, Request, StepResult
from sim.hardware import GiB, HardwareSpec, hardware_spec
from sim.model_specs import ModelSpec, model_spec

# Bytes per weight / KV element. Only 16-bit types: HardwareSpec.peak_flops is the bf16/fp16 rate.
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2}

# FlashAttention's forward pass tiles the queries in blocks of 128 rows and streams the
# context's K/V from HBM once per tile, so a prefill chunk of n tokens over a context of c
# reads about n * c / 128 tokens of KV (exact once n >= 128; an undercount below that).
ATTN_QUERY_TILE_ROWS = 128


@dataclass(frozen=True, slots=True)
class AnalyticCostModel:
    """A Backend whose step time is a roofline of the plan's FLOPs and bytes."""

    model: ModelSpec
    hardware: HardwareSpec
    dtype: str = "bf16"
    # Achieved fraction of peak dense FLOP/s over a whole forward. cuBLAS reaches ~80% of
    # peak on large bf16 GEMMs; norms, RoPE, activations and attention pull a full prefill
    # to the 50-70% MFU reported for A100/H100 (Sarathi-Serve, OSDI'24; vLLM/Vidur profiles).
    flops_efficiency: float = 0.6
    # Achieved fraction of datasheet HBM bandwidth (MBU, as defined in Databricks' "LLM
    # Inference Performance Engineering", 2023). Plain device copies reach ~90% on Hopper;
    # decode GEMV + paged-attention kernels in vLLM-class engines land at 70-85%.
    bandwidth_efficiency: float = 0.8
    # Per-step time outside the GPU kernels: scheduling, input preparation, sampling and
    # launch gaps. vLLM-class engines with CUDA graphs expose ~0.5-1 ms a step; eager mode
    # (no graphs) 1-3 ms. 1 ms puts Llama-3-8B batch-1 decode on an H100 at ~6.6 ms.
    overhead_s: float = 1e-3
    # Memory the engine needs besides weights and KV: non-torch memory (CUDA context, cuBLAS
    # and NCCL workspaces) plus the activation peak of the profiling forward. vLLM's memory
    # profile of Llama-3-8B on an H100 reports 1.79 + 1.26 GiB (vLLM PR #10511).
    reserve_bytes: int = 3 * GiB

    # Derived at construction; all times in seconds per unit named.
    dtype_bytes: int = field(init=False, repr=False)
    weight_bytes: int = field(init=False, repr=False)  # every parameter, as stored on the GPU
    _compute_s_per_token: float = field(init=False, repr=False, compare=False)
    _compute_s_per_attn_pair: float = field(init=False, repr=False, compare=False)
    _compute_s_per_sampled_row: float = field(init=False, repr=False, compare=False)
    _memory_s_weights: float = field(init=False, repr=False, compare=False)
    _memory_s_per_kv_token: float = field(init=False, repr=False, compare=False)
    _memory_s_per_prefill_pair: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            known = ", ".join(DTYPE_BYTES)
            raise ValueError(f"AnalyticCostModel: unknown dtype {self.dtype!r}; known: {known}")
        for key in ("flops_efficiency", "bandwidth_efficiency"):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise ValueError(f"AnalyticCostModel: {key} must be in (0, 1]")
        if not self.overhead_s >= 0.0:
            raise ValueError(f"AnalyticCostModel: overhead_s must be >= 0, got {self.overhead_s}")
        if self.reserve_bytes < 0:
            raise ValueError("AnalyticCostModel: reserve_bytes must be >= 0")
        for key, value in _coefficients(self).items():
            object.__setattr__(self, key, value)

    @classmethod
    def preset(
        cls, model_name: str = "llama-3-8b", hardware_name: str = "h100", dtype: str = "bf16"
    ) -> AnalyticCostModel:
        """Build from preset names (servelab's default deployment: Llama-3-8B, H100, bf16)."""
        return cls(model_spec(model_name), hardware_spec(hardware_name), dtype)

    def predict(self, plan: BatchPlan) -> float:
        """Seconds one engine step of `plan` takes; 0 for a plan that computes nothing."""
        decode_seqs = plan.decode_seqs  # padding rows included: a padding row is a decode row
        tokens = plan.prefill_tokens + decode_seqs
        if not tokens:
            return 0.0
        prefill_attn = plan.prefill_attn
        decode_context = plan.decode_context
        compute_s = (
            self._compute_s_per_token * tokens
            + self._compute_s_per_attn_pair * (prefill_attn + decode_context)
            + self._compute_s_per_sampled_row * (plan.prefill_seqs + decode_seqs)
        )
        memory_s = (
            self._memory_s_weights
            + self._memory_s_per_kv_token * (tokens + decode_context)
            + self._memory_s_per_prefill_pair * prefill_attn
        )
        return (compute_s if compute_s > memory_s else memory_s) + self.overhead_s

    def execute(self, plan: BatchPlan) -> StepResult:
        """Backend protocol: the predicted duration, no sampled tokens."""
        return StepResult(duration_s=self.predict(plan))

    def free(self, request: Request) -> None:
        """Backend protocol: the cost model keeps no per-request state."""

    def kv_pool_blocks(self, block_size: int, memory_utilization: float = 0.9) -> int:
        """KV blocks that fit in memory_utilization x GPU memory after weights and reserve."""
        if block_size < 1:
            raise ValueError(f"kv_pool_blocks: block_size must be >= 1, got {block_size}")
        if not 0.0 < memory_utilization <= 1.0:
            raise ValueError(
                f"kv_pool_blocks: memory_utilization must be in (0, 1], got {memory_utilization}"
            )
        # Like vLLM's gpu_memory_utilization: a fraction of the whole GPU for this engine.
        budget_bytes = self.hardware.memory_bytes * memory_utilization
        kv_bytes = budget_bytes - self.weight_bytes - self.reserve_bytes
        block_bytes = self.model.kv_bytes_per_token(self.dtype_bytes) * block_size
        if kv_bytes < block_bytes:
            raise ValueError(
                f"model {self.model.name} ({self.dtype}) does not fit on {self.hardware.name}: "
                f"weights {self.weight_bytes / GiB:.1f} GiB + reserve "
                f"{self.reserve_bytes / GiB:.1f} GiB leave no room for one KV block in "
                f"{memory_utilization:g} x {self.hardware.memory_bytes / GiB:.0f} GiB"
            )
        return int(kv_bytes // block_bytes)


def _coefficients(cost: AnalyticCostModel) -> dict[str, float | int]:
    """The constant per-unit times behind `predict`, and the byte sizes they come from."""
    spec = cost.model
    dtype_bytes = DTYPE_BYTES[cost.dtype]
    flops_s = cost.hardware.peak_flops * cost.flops_efficiency  # achieved FLOP/s
    bytes_s = cost.hardware.mem_bandwidth_bytes_s * cost.bandwidth_efficiency  # achieved B/s
    embed_params = spec.vocab_size * spec.hidden_size  # one vocab x hidden matrix
    num_matrices = 1 if spec.tie_word_embeddings else 2  # input embedding, lm_head
    linear_params = spec.num_params - num_matrices * embed_params  # every token's GEMMs
    # A step reads every weight once, except the input embedding: only the rows of this
    # step's tokens are gathered. A tied matrix is read in full as the lm_head.
    read_params = linear_params + embed_params
    kv_bytes_per_token = spec.kv_bytes_per_token(dtype_bytes)
    # QK^T and PV: 2 FLOPs per multiply-add, 2 matmuls, over every query head's head_dim.
    # A prefill chunk counts its full chunk x context rectangle although a causal kernel
    # skips about half of a first chunk's square; attention kernels also run below GEMM
    # efficiency (FlashAttention-2 forward ~50-70% of peak), and the two roughly cancel.
    attn_flops_per_pair = 4 * spec.num_layers * spec.num_heads * spec.head_dim
    return {
        "dtype_bytes": dtype_bytes,
        "weight_bytes": spec.num_params * dtype_bytes,
        "_compute_s_per_token": 2 * linear_params / flops_s,
        "_compute_s_per_attn_pair": attn_flops_per_pair / flops_s,
        # lm_head runs only for rows that sample: the last position of each sequence.
        "_compute_s_per_sampled_row": 2 * embed_params / flops_s,
        "_memory_s_weights": read_params * dtype_bytes / bytes_s,
        # Each new token writes its K/V once; each decode reads its whole context once.
        "_memory_s_per_kv_token": kv_bytes_per_token / bytes_s,
        "_memory_s_per_prefill_pair": kv_bytes_per_token / ATTN_QUERY_TILE_ROWS / bytes_s,
    }
