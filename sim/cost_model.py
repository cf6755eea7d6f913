"""Analytic roofline cost model: one step's time from model shapes and a GPU's datasheet peaks.

step_s = max(FLOPs / achieved FLOP/s, bytes moved / achieved bandwidth) per GPU, plus tensor-
parallel all-reduces and per-step overhead, with every coefficient precomputed so `predict` is
a few multiply-adds (it runs per step).
"""

from __future__ import annotations

import math
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
    # GPUs one model instance is split over, Megatron-style as vLLM does it: each GPU holds
    # 1/tp of the linear weights, attention heads and (vocab-parallel) embedding/lm_head.
    tensor_parallel: int = 1
    # Fixed cost of one all-reduce (or gather) on top of its bytes: the launch and
    # synchronisation that set an NCCL-class small-message all-reduce's latency within an
    # NVLink node. vLLM's all-reduce took ~9-12 us a call for small messages on H100 at
    # tp 2-8 outside CUDA graphs (benchmark in sglang PR #2904).
    allreduce_latency_s: float = 10e-6

    # Derived at construction; all times in seconds per unit named, on each GPU.
    dtype_bytes: int = field(init=False, repr=False)
    weight_bytes: int = field(init=False, repr=False)  # every parameter, summed over the GPUs
    gpu_kv_bytes_per_token: int = field(init=False, repr=False)  # K+V one GPU holds a token
    _compute_s_per_token: float = field(init=False, repr=False, compare=False)
    _compute_s_per_attn_pair: float = field(init=False, repr=False, compare=False)
    _compute_s_per_sampled_row: float = field(init=False, repr=False, compare=False)
    _memory_s_weights: float = field(init=False, repr=False, compare=False)
    _memory_s_per_kv_token: float = field(init=False, repr=False, compare=False)
    _memory_s_per_prefill_pair: float = field(init=False, repr=False, compare=False)
    _comm_s_per_token: float = field(init=False, repr=False, compare=False)
    _comm_s_per_sampled_row: float = field(init=False, repr=False, compare=False)
    _comm_s_per_step: float = field(init=False, repr=False, compare=False)
    _swap_s_per_token: float = field(init=False, repr=False, compare=False)

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
        if not self.allreduce_latency_s >= 0.0:
            raise ValueError(
                f"AnalyticCostModel: allreduce_latency_s must be >= 0, "
                f"got {self.allreduce_latency_s}"
            )
        _check_tensor_parallel(self.model, self.hardware, self.tensor_parallel)
        for key, value in _coefficients(self).items():
            object.__setattr__(self, key, value)

    @classmethod
    def preset(
        cls,
        model_name: str = "llama-3-8b",
        hardware_name: str = "h100",
        dtype: str = "bf16",
        tensor_parallel: int = 1,
    ) -> AnalyticCostModel:
        """Build from preset names (servelab's default deployment: Llama-3-8B, one H100, bf16)."""
        return cls(
            model_spec(model_name), hardware_spec(hardware_name), dtype,
            tensor_parallel=tensor_parallel,
        )

    @property
    def reads_rows(self) -> bool:
        """A step's time comes from the plan's totals alone (sim.deferred may apply)."""
        return False

    @property
    def num_gpus(self) -> int:
        """GPUs one instance of this deployment occupies."""
        return self.tensor_parallel

    def predict(self, plan: BatchPlan) -> float:
        """Seconds one engine step of `plan` takes; 0 for a plan that computes nothing."""
        decode_seqs = plan.decode_seqs  # padding rows included: a padding row is a decode row
        tokens = plan.prefill_tokens + decode_seqs
        # KV swapped to or from host memory (--preemption swap) is copied before the forward.
        swap_s = self._swap_s_per_token * plan.swap_tokens
        if not tokens:
            return swap_s
        prefill_attn = plan.prefill_attn
        decode_context = plan.decode_context
        sampled_rows = plan.prefill_seqs + decode_seqs
        compute_s = (
            self._compute_s_per_token * tokens
            + self._compute_s_per_attn_pair * (prefill_attn + decode_context)
            + self._compute_s_per_sampled_row * sampled_rows
        )
        memory_s = (
            self._memory_s_weights
            + self._memory_s_per_kv_token * (tokens + decode_context)
            + self._memory_s_per_prefill_pair * prefill_attn
        )
        # All-reduces wait on the layer before them and block the next: not overlapped.
        comm_s = (
            self._comm_s_per_token * tokens
            + self._comm_s_per_sampled_row * sampled_rows
            + self._comm_s_per_step
        )
        return ((compute_s if compute_s > memory_s else memory_s) + comm_s + swap_s
                + self.overhead_s)

    def decode_steps_s(self, rows: int, context: int, num_steps: int) -> list[float]:
        """What predict gives each of num_steps plans that decode the same `rows` rows a
        token each, over `context` tokens of KV in all at the first and `rows` more at each
        next: the same terms in the same order, so the same floats (quiet runs price many
        steps at once, sim.coast)."""
        if rows < 1:
            raise ValueError(f"decode_steps_s: rows must be >= 1, got {rows}")
        per_token = self._compute_s_per_token * rows
        per_sampled = self._compute_s_per_sampled_row * rows
        per_pair, weights_s = self._compute_s_per_attn_pair, self._memory_s_weights
        per_kv, overhead_s = self._memory_s_per_kv_token, self.overhead_s
        comm_s = (self._comm_s_per_token * rows + self._comm_s_per_sampled_row * rows
                  + self._comm_s_per_step)
        durations = []
        for decode_context in range(context, context + rows * num_steps, rows):
            compute_s = per_token + per_pair * decode_context + per_sampled
            memory_s = weights_s + per_kv * (rows + decode_context)
            durations.append((compute_s if compute_s > memory_s else memory_s) + comm_s
                             + overhead_s)
        return durations

    def execute(self, plan: BatchPlan) -> StepResult:
        """Backend protocol: the predicted duration, no sampled tokens."""
        return StepResult(duration_s=self.predict(plan))

    def free(self, request: Request) -> None:
        """Backend protocol: the cost model keeps no per-request state."""

    def kv_pool_blocks(self, block_size: int, memory_utilization: float = 0.9) -> int:
        """KV blocks fitting in utilization x memory of all tp GPUs after weights and reserves."""
        if block_size < 1:
            raise ValueError(f"kv_pool_blocks: block_size must be >= 1, got {block_size}")
        if not 0.0 < memory_utilization <= 1.0:
            raise ValueError(
                f"kv_pool_blocks: memory_utilization must be in (0, 1], got {memory_utilization}"
            )
        tp = self.tensor_parallel
        # Like vLLM's gpu_memory_utilization: a fraction of each whole GPU for this engine.
        # Every GPU keeps its own reserve; the weights are split across them.
        budget_bytes = self.hardware.memory_bytes * memory_utilization * tp
        kv_bytes = budget_bytes - self.weight_bytes - tp * self.reserve_bytes
        # One block holds block_size tokens of every layer's K/V, spread over the tp GPUs
        # (replicated KV heads counted on every GPU that stores them).
        block_bytes = self.gpu_kv_bytes_per_token * tp * block_size
        if kv_bytes < block_bytes:
            raise ValueError(
                f"model {self.model.name} ({self.dtype}) does not fit on {self.hardware.name} "
                f"x {tp}: weights {self.weight_bytes / GiB:.1f} GiB + reserve "
                f"{tp} x {self.reserve_bytes / GiB:.1f} GiB leave no room for one KV block in "
                f"{memory_utilization:g} x {tp} x {self.hardware.memory_bytes / GiB:.0f} GiB"
            )
        return int(kv_bytes // block_bytes)


def _check_tensor_parallel(model: ModelSpec, hardware: HardwareSpec, tp: int) -> None:
    """Raise unless `tp` GPUs can split `model` the way vLLM's tensor parallelism does."""
    where = f"AnalyticCostModel: tensor_parallel={tp} for {model.name} on {hardware.name}"
    if tp < 1:
        raise ValueError(f"{where}: must be >= 1")
    if tp > hardware.max_gpus:
        raise ValueError(f"{where}: exceeds the {hardware.max_gpus} GPUs of one NVLink node")
    if model.num_heads % tp:
        raise ValueError(f"{where}: must divide the model's {model.num_heads} attention heads")
    # vLLM splits KV heads evenly, or replicates each on tp / num_kv_heads GPUs.
    if model.num_kv_heads % tp and tp % model.num_kv_heads:
        raise ValueError(
            f"{where}: must divide or be a multiple of the model's {model.num_kv_heads} KV heads"
        )


def _coefficients(cost: AnalyticCostModel) -> dict[str, float | int]:
    """The constant per-unit times behind `predict`, and the byte sizes they come from."""
    spec, tp = cost.model, cost.tensor_parallel
    dtype_bytes = DTYPE_BYTES[cost.dtype]
    flops_s = cost.hardware.peak_flops * cost.flops_efficiency  # one GPU's achieved FLOP/s
    bytes_s = cost.hardware.mem_bandwidth_bytes_s * cost.bandwidth_efficiency  # one GPU's B/s
    embed_params = spec.vocab_size * spec.hidden_size  # one vocab x hidden matrix
    num_matrices = 1 if spec.tie_word_embeddings else 2  # input embedding, lm_head
    linear_params = spec.num_params - num_matrices * embed_params  # every token's GEMMs
    # A step reads every weight once, except the input embedding: only the rows of this
    # step's tokens are gathered. A tied matrix is read in full as the lm_head.
    read_params = linear_params + embed_params
    # Each GPU stores K/V for ceil(num_kv_heads / tp) heads: a slice of them while
    # tp <= num_kv_heads, one replicated head beyond that (as vLLM does).
    kv_heads_per_gpu = math.ceil(spec.num_kv_heads / tp)
    gpu_kv_bytes_per_token = (
        spec.kv_bytes_per_token(dtype_bytes) // spec.num_kv_heads * kv_heads_per_gpu
    )
    # QK^T and PV: 2 FLOPs per multiply-add, 2 matmuls, over every query head's head_dim.
    # A prefill chunk counts its full chunk x context rectangle although a causal kernel
    # skips about half of a first chunk's square; attention kernels also run below GEMM
    # efficiency (FlashAttention-2 forward ~50-70% of peak), and the two roughly cancel.
    attn_flops_per_pair = 4 * spec.num_layers * spec.num_heads * spec.head_dim
    # The tp GPUs run in lockstep, each on its 1/tp of the FLOPs and weight bytes, so a
    # step takes one GPU's time (norm weights, replicated on every GPU, are < 0.01%).
    return {
        "dtype_bytes": dtype_bytes,
        "weight_bytes": spec.num_params * dtype_bytes,
        "gpu_kv_bytes_per_token": gpu_kv_bytes_per_token,
        "_compute_s_per_token": 2 * linear_params / tp / flops_s,
        "_compute_s_per_attn_pair": attn_flops_per_pair / tp / flops_s,
        # lm_head runs only for rows that sample: the last position of each sequence.
        "_compute_s_per_sampled_row": 2 * embed_params / tp / flops_s,
        "_memory_s_weights": read_params * dtype_bytes / tp / bytes_s,
        # Each new token writes its K/V once; each decode reads its whole context once.
        "_memory_s_per_kv_token": gpu_kv_bytes_per_token / bytes_s,
        "_memory_s_per_prefill_pair": gpu_kv_bytes_per_token / ATTN_QUERY_TILE_ROWS / bytes_s,
        **_comm_coefficients(cost, dtype_bytes),
        # Each GPU moves its own share of a token's KV over its own PCIe link, in parallel.
        "_swap_s_per_token": gpu_kv_bytes_per_token / cost.hardware.host_link_bytes_s,
    }


def _comm_coefficients(cost: AnalyticCostModel, dtype_bytes: int) -> dict[str, float]:
    """Seconds of tensor-parallel communication per token, sampled row and step; 0 on 1 GPU."""
    tp, spec = cost.tensor_parallel, cost.model
    if tp == 1:
        return {"_comm_s_per_token": 0.0, "_comm_s_per_sampled_row": 0.0, "_comm_s_per_step": 0.0}
    link_bytes_s = cost.hardware.interconnect_bytes_s
    # Row-parallel attention output and MLP down projections each all-reduce the
    # [tokens, hidden] activations; the vocab-parallel embedding adds one more.
    num_allreduces = 2 * spec.num_layers + 1
    # A ring all-reduce sends and receives 2 (tp - 1) / tp of the buffer on every link.
    ring_bytes_per_token = 2 * (tp - 1) / tp * spec.hidden_size * dtype_bytes
    # The vocab-parallel lm_head's logits, [rows, vocab / tp] on each GPU, are gathered to
    # the sampling GPU, which receives (tp - 1) / tp of each row through its own link.
    gather_bytes_per_row = (tp - 1) / tp * spec.vocab_size * dtype_bytes
    return {
        "_comm_s_per_token": num_allreduces * ring_bytes_per_token / link_bytes_s,
        "_comm_s_per_sampled_row": gather_bytes_per_row / link_bytes_s,
        "_comm_s_per_step": (num_allreduces + 1) * cost.allreduce_latency_s,  # + the gather
    }
