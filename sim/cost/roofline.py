"""Analytic roofline cost model: one step's time from model shapes and a GPU's datasheet peaks.

step_s = max(FLOPs / achieved FLOP/s, bytes moved / achieved bandwidth) per GPU, plus tensor-
parallel all-reduces and per-step overhead, with every coefficient precomputed so `predict` is
a few multiply-adds (it runs per step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.cost.roofline_coefficients import (
    ATTN_QUERY_TILE_ROWS,  # noqa: F401 (re-exported: the feature's one source of truth)
    check_parallel,
    coefficients,
    rank_weight_bytes,
    windowed_sums,
)
from sim.engine.core import BatchPlan, Request, StepResult
from sim.specs.engine_limits import kv_blocks
from sim.specs.hardware import GiB, HardwareSpec, hardware_spec
from sim.specs.kv_reserve import ProfileShape, vllm_reserve_bytes
from sim.specs.model_config import resolve_model
from sim.specs.model_specs import ModelSpec

# Bytes per weight / KV element; GEMMs run at HardwareSpec.flops_for(dtype). 16-bit only, as
# vLLM's --dtype; FP8 is a quantization there (QUANTIZATIONS).
DTYPE_BYTES: dict[str, int] = {"bf16": 2, "fp16": 2}
# vLLM's --quantization values priced: fp8 stores the linear layers' weights in one byte
# (per-tensor scales, negligible) and, on GPUs with FP8 tensor cores, runs their GEMMs on
# them with activations quantized per step; everything else keeps the dtype (KV: below).
QUANTIZATIONS: tuple[str, ...] = ("fp8",)
# vLLM's --kv-cache-dtype values: auto stores K and V in the model's dtype (or the
# checkpoint's own KV scheme, sim.specs.model_config); the fp8 formats store one byte an
# element (per-tensor scales, negligible). fp8 means fp8_e4m3 on NVIDIA GPUs.
KV_CACHE_DTYPES: tuple[str, ...] = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")


def check_quantization(owner: str, quantization: str | None, gpu: str,
                       peak_fp8_flops: float | None) -> None:
    """Raise unless quantization is None or one of QUANTIZATIONS the GPU runs: FP8 needs FP8
    tensor cores. vLLM runs FP8 weights on others (A100) as weight-only Marlin kernels,
    16-bit GEMMs on weights widened as they are read; neither cost model prices those."""
    if quantization not in (None, *QUANTIZATIONS):
        raise ValueError(f"{owner}: quantization {quantization!r}: choose from "
                         f"{', '.join(QUANTIZATIONS)}")
    if quantization and not peak_fp8_flops:
        raise ValueError(f"--quantization fp8: {gpu} has no FP8 tensor cores (vLLM's "
                         "weight-only FP8 there is not priced)")


def kv_element_bytes(kv_cache_dtype: str, dtype: str) -> int:
    """Bytes of one K or V element under vLLM's --kv-cache-dtype (auto: the dtype's)."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype!r}: choose from "
                         f"{', '.join(KV_CACHE_DTYPES)}")
    return DTYPE_BYTES[dtype] if kv_cache_dtype == "auto" else 1


def check_kv_cache_dtype(kv_cache_dtype: str, gpu: str, peak_fp8_flops: float | None) -> None:
    """Raise unless the GPU runs the KV cache dtype: an FP8 KV cache is priced on GPUs whose
    datasheet gives FP8 tensor cores only (vLLM's FP8 KV on older GPUs converts in software
    inside the attention kernels, which no cost model here prices)."""
    kv_element_bytes(kv_cache_dtype, "bf16")  # (names the choices for an unknown one)
    if kv_cache_dtype != "auto" and not peak_fp8_flops:
        raise ValueError(f"--kv-cache-dtype {kv_cache_dtype}: {gpu} has no FP8 support "
                         "(datasheet); its FP8 KV cache is not priced")


# Not frozen: __post_init__ derives the per-unit times below once, from the fields above;
# nothing assigns a field after construction.
@dataclass(slots=True)
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
    # Memory each GPU needs besides weights and KV: what vLLM's start-up profile holds back
    # (non-torch memory and the activation peak, sim.specs.kv_reserve). None: profiled at
    # servelab's defaults (2,048 tokens, 256 sequences); a Deployment passes its own.
    reserve_bytes: int | None = None
    # GPUs one model instance is split over, Megatron-style as vLLM does it: each GPU holds
    # 1/tp of the linear weights, attention heads and (vocab-parallel) embedding/lm_head.
    tensor_parallel: int = 1
    # Fixed cost of one all-reduce (or gather) on top of its bytes: the launch and
    # synchronisation that set an NCCL-class small-message all-reduce's latency within an
    # NVLink node. vLLM's all-reduce took ~9-12 us a call for small messages on H100 at
    # tp 2-8 outside CUDA graphs (benchmark in sglang PR #2904).
    allreduce_latency_s: float = 10e-6
    # Data-parallel ranks of the deployment (each its own engine, priced one at a time) and
    # whether their experts are sharded across all tp x dp GPUs (vLLM's expert parallel).
    data_parallel: int = 1
    expert_parallel: bool = False
    quantization: str | None = None  # one of QUANTIZATIONS, or None: weights in dtype
    kv_cache_dtype: str = "auto"  # one of KV_CACHE_DTYPES: the KV pool's and reads' bytes

    # Derived at construction; all times in seconds per unit named, on each GPU.
    dtype_bytes: int = field(init=False, repr=False)
    linear_bytes: int = field(init=False, repr=False)  # a linear layer's weight
    kv_bytes: int = field(init=False, repr=False)  # one K or V element in the KV cache
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
    # Mixture of experts (0 local experts: dense): experts one GPU holds, seconds to read
    # one of them in every MoE layer, and how many tokens per step's token reach them.
    _local_experts: int = field(init=False, repr=False, compare=False)
    _expert_read_s: float = field(init=False, repr=False, compare=False)
    _expert_token_scale: int = field(init=False, repr=False, compare=False)
    # Sliding-window layers per full-attention layer, and their window (0: none).
    _window_ratio: float = field(init=False, repr=False, compare=False)
    _window: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            known = ", ".join(DTYPE_BYTES)
            raise ValueError(f"AnalyticCostModel: unknown dtype {self.dtype!r}; known: {known}")
        for key in ("flops_efficiency", "bandwidth_efficiency"):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise ValueError(f"AnalyticCostModel: {key} must be in (0, 1]")
        if not self.overhead_s >= 0.0:
            raise ValueError(f"AnalyticCostModel: overhead_s must be >= 0, got {self.overhead_s}")
        if self.reserve_bytes is not None and self.reserve_bytes < 0:
            raise ValueError("AnalyticCostModel: reserve_bytes must be >= 0")
        if not self.allreduce_latency_s >= 0.0:
            raise ValueError(
                f"AnalyticCostModel: allreduce_latency_s must be >= 0, "
                f"got {self.allreduce_latency_s}"
            )
        check_parallel(self.model, self.hardware, self.tensor_parallel, self.data_parallel,
                       self.expert_parallel)
        check_quantization("AnalyticCostModel", self.quantization, self.hardware.name,
                           self.hardware.peak_fp8_flops)
        self.linear_bytes = 1 if self.quantization == "fp8" else DTYPE_BYTES[self.dtype]
        check_kv_cache_dtype(self.kv_cache_dtype, self.hardware.name,
                             self.hardware.peak_fp8_flops)
        self.kv_bytes = kv_element_bytes(self.kv_cache_dtype, self.dtype)
        if self.reserve_bytes is None:
            self.reserve_bytes = vllm_reserve_bytes(
                self.model, ProfileShape(), DTYPE_BYTES[self.dtype], self.tensor_parallel,
                self.data_parallel, self.expert_parallel)
        for key, value in coefficients(self, DTYPE_BYTES[self.dtype]).items():
            setattr(self, key, value)

    @classmethod
    def preset(
        cls,
        model_name: str = "llama-3-8b",
        hardware_name: str = "h100",
        dtype: str = "bf16",
        tensor_parallel: int = 1,
    ) -> AnalyticCostModel:
        """Build from a model preset, shipped Hugging Face id or config path, and a GPU name
        or file (servelab's default deployment: Llama-3-8B, one H100, bf16)."""
        hardware = hardware_spec(hardware_name)
        return cls(
            resolve_model(model_name), hardware, dtype, tensor_parallel=tensor_parallel,
            allreduce_latency_s=hardware.interconnect_latency_s,
        )

    @property
    def reads_rows(self) -> bool:
        """A step's time comes from the plan's totals alone (sim.engine.fast_forward may apply)."""
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
        kv_tokens = tokens
        if self._window:  # sliding-window layers' windowed sums, in full-layer units
            prefill_attn, decode_context, kv_tokens = windowed_sums(self, plan, tokens)
        sampled_rows = plan.prefill_seqs + decode_seqs
        compute_s = (
            self._compute_s_per_token * tokens
            + self._compute_s_per_attn_pair * (prefill_attn + decode_context)
            + self._compute_s_per_sampled_row * sampled_rows
        )
        weights_s = self._memory_s_weights
        if self._local_experts:  # MoE: the experts this step's tokens reach
            weights_s += self.expert_weights_s(tokens)
        memory_s = (
            weights_s
            + self._memory_s_per_kv_token * (kv_tokens + decode_context)
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
        next: the same terms in the same order, so the same floats (fast-forward runs price
        many steps at once, sim.engine.fast_forward_run)."""
        if rows < 1:
            raise ValueError(f"decode_steps_s: rows must be >= 1, got {rows}")
        per_token = self._compute_s_per_token * rows
        per_sampled = self._compute_s_per_sampled_row * rows
        per_pair, weights_s = self._compute_s_per_attn_pair, self._memory_s_weights
        if self._local_experts:
            weights_s += self.expert_weights_s(rows)
        per_kv, overhead_s = self._memory_s_per_kv_token, self.overhead_s
        comm_s = (self._comm_s_per_token * rows + self._comm_s_per_sampled_row * rows
                  + self._comm_s_per_step)
        durations = []
        kv_rows = rows * (1.0 + self._window_ratio) if self._window else rows
        for decode_context in range(context, context + rows * num_steps, rows):
            if self._window:  # windowed_sums' decode terms, as predict takes them
                decode_context += self._window_ratio * min(decode_context,
                                                           rows * self._window)
            compute_s = per_token + per_pair * decode_context + per_sampled
            memory_s = weights_s + per_kv * (kv_rows + decode_context)
            durations.append((compute_s if compute_s > memory_s else memory_s) + comm_s
                             + overhead_s)
        return durations

    def expert_weights_s(self, tokens: int) -> float:
        """Seconds one GPU spends reading the experts a step of `tokens` tokens reaches."""
        share = 1.0 - (1.0 - self.model.num_experts_per_tok / self.model.num_experts) ** (
            tokens * self._expert_token_scale)
        return self._local_experts * share * self._expert_read_s

    @property
    def rank_weight_bytes(self) -> int:
        """Weight bytes on each GPU (tp and expert-parallel shards)."""
        return rank_weight_bytes(self)

    def execute(self, plan: BatchPlan) -> StepResult:
        """Backend protocol: the predicted duration, no sampled tokens."""
        return StepResult(duration_s=self.predict(plan))

    def free(self, request: Request) -> None:
        """Backend protocol: the cost model keeps no per-request state."""

    def kv_pool_blocks(self, block_size: int, memory_utilization: float = 0.9) -> int:
        """KV blocks of one engine, as vLLM sizes them on each of its GPUs: utilization x
        memory, less that GPU's weights and its activation and graph reserve, over one
        block's bytes on that GPU (docs/deployment.md)."""
        if block_size < 1:
            raise ValueError(f"kv_pool_blocks: block_size must be >= 1, got {block_size}")
        if not 0.0 < memory_utilization <= 1.0:
            raise ValueError(
                f"kv_pool_blocks: memory_utilization must be in (0, 1], got {memory_utilization}"
            )
        kv_bytes = self.kv_cache_bytes(memory_utilization)
        block_bytes = self.gpu_kv_bytes_per_token * block_size
        if kv_bytes < block_bytes:
            tp = self.tensor_parallel
            weights = f"{self.dtype}, fp8 weights" if self.quantization else self.dtype
            if self.kv_cache_dtype != "auto":
                weights += f", {self.kv_cache_dtype} KV"
            raise ValueError(
                f"model {self.model.name} ({weights}) does not fit on {self.hardware.name} "
                f"x {tp}: weights {self.rank_weight_bytes / GiB:.1f} GiB + reserve "
                f"{self.reserve_bytes / GiB:.1f} GiB a GPU leave no room for one KV block in "
                f"{memory_utilization:g} x {self.hardware.memory_bytes / GiB:.1f} GiB"
            )
        return kv_blocks(kv_bytes, block_bytes)

    def kv_cache_bytes(self, memory_utilization: float = 0.9) -> float:
        """Bytes each GPU has left for KV: vLLM's gpu_memory_utilization x memory, less the
        GPU's weights and reserve (negative when they do not fit)."""
        return (self.hardware.memory_bytes * memory_utilization - self.rank_weight_bytes
                - self.reserve_bytes)
