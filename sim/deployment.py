"""One deployment: model, GPU, dtype, parallelism, KV pool and cost model, built once.

`DeploymentOptions` holds what the user asked for (the CLI's flags, vLLM's names and
defaults); `build_deployment` resolves it into a frozen `Deployment` that every command,
benchmark and test passes down. The KV pool is sized as vLLM sizes it (docs/deployment.md).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from sim.cost.calibrated import CalibratedCostModel
from sim.cost.drafter import DrafterCost, SpeculativeCostModel, TargetPricing, drafter_cost
from sim.cost.gpu_terms import coverage as gpu_coverage
from sim.cost.roofline import DTYPE_BYTES, AnalyticCostModel, kv_element_bytes
from sim.engine.core import Backend
from sim.engine.speculation.config import DRAFTER_METHODS, SpeculativeConfig
from sim.pricing import DEFAULT_COST, pick_cost_model
from sim.specs.engine_limits import ENGINE_DEFAULTS, EngineLimits, kv_blocks, vllm_server_limits
from sim.specs.hardware import GiB, HardwareSpec, hardware_spec
from sim.specs.kv_reserve import ProfileShape, vllm_reserve_bytes
from sim.specs.model_config import resolve_model
from sim.specs.model_mechanisms import pricing_notes
from sim.specs.model_specs import ModelSpec

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # vLLM's gpu_memory_utilization default

# vLLM's --dtype values and servelab's, as the cost model names them. `auto` takes the
# checkpoint's dtype, bf16 for every model servelab ships.
DTYPE_NAMES = {"auto": "bf16", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16",
               "float16": "fp16", "half": "fp16"}


def normalize_dtype(text: str) -> str:
    """bf16 or fp16 from any of vLLM's or servelab's spellings."""
    try:
        return DTYPE_NAMES[text]
    except KeyError:
        raise ValueError(f"--dtype {text!r}: choose from {', '.join(DTYPE_NAMES)}") from None


@dataclass(frozen=True)
class DeploymentOptions:
    """What the flags ask for; `build_deployment` resolves it."""

    model: str = "llama-3-8b"  # preset, shipped Hugging Face id, or config.json path
    hardware: str = "h100"  # GPU preset or GPU file
    dtype: str = "bf16"  # any DTYPE_NAMES spelling
    tensor_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: bool = False
    block_size: int = ENGINE_DEFAULTS.block_size
    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    num_blocks: int | None = None  # overrides the sized pool
    # What vLLM's memory profile runs (the reserve grows with both): None is the engine
    # limits' (Deployment.engine_limits).
    max_num_batched_tokens: int | None = None
    max_num_seqs: int | None = None
    # The limits a flag left unset takes: vLLM's for this GPU and the model's whole context
    # (a deployment the user named), else servelab's CPU-lab ENGINE_DEFAULTS.
    vllm_defaults: bool = False
    cost_model: Path | None = None  # a calibration instead of the analytic model
    # What prices steps (COSTS): gpu (fitted on GPU profiles), auto (vLLM's measured kernels
    # where the GPU has tables, else the fitted model), kernels or roofline.
    cost: str = DEFAULT_COST
    quantization: str | None = None  # vLLM's --quantization: fp8, or None (weights in dtype)
    vllm_version: str | None = None  # the kernel tables' vLLM version (None: newest measured)
    # vLLM's --kv-cache-dtype (KV_CACHE_DTYPES): auto is the checkpoint's own KV scheme where
    # its quantization_config names one, else the dtype.
    kv_cache_dtype: str = "auto"


@dataclass(frozen=True)
class Parallelism:
    """vLLM's parallel layout: tp GPUs per engine, dp engines, experts over all tp x dp."""

    tensor_parallel: int = 1
    data_parallel: int = 1
    expert_parallel: bool = False

    @property
    def num_gpus(self) -> int:
        return self.tensor_parallel * self.data_parallel


@dataclass(frozen=True)
class KvPool:
    """One engine's KV pool and how it was sized (per-GPU bytes; None when not sized)."""

    num_blocks: int
    block_size: int
    block_bytes: int  # one block's K and V over the whole model (all layers, all GPUs)
    sized_by: str  # "vllm" (memory left), "--num-blocks", or "calibration"
    gpu_memory_utilization: float | None = None
    gpu_memory_bytes: int | None = None
    gpu_weight_bytes: int | None = None
    gpu_reserve_bytes: int | None = None
    gpu_kv_bytes: float | None = None

    def blocks_in_gib(self, gib: float) -> int:
        """KV blocks `gib` GiB of memory holds (host swap space, --swap-space-gib)."""
        return kv_blocks(gib * GiB, self.block_bytes)

    def describe(self) -> str:
        """One line: blocks, and the vLLM sizing rule's terms when sized by it."""
        head = f"KV pool: {self.num_blocks} blocks of {self.block_size} tokens"
        if self.sized_by != "vllm":
            return f"{head} ({self.sized_by})"
        return (f"{head} = ({self.gpu_memory_utilization:g} x "
                f"{self.gpu_memory_bytes / GiB:.2f} GiB - weights "
                f"{self.gpu_weight_bytes / GiB:.2f} GiB - reserve "
                f"{self.gpu_reserve_bytes / GiB:.2f} GiB) a GPU = "
                f"{self.gpu_kv_bytes / GiB:.2f} GiB of KV a GPU")


@dataclass(frozen=True)
class Deployment:
    """Everything a run needs about what serves it, resolved once from the options."""

    model: ModelSpec
    hardware: HardwareSpec | None  # None: a calibration measured on whatever it ran on
    dtype: str
    parallel: Parallelism
    kv_pool: KvPool
    cost_model: Backend = field(compare=False)
    max_model_len: int  # the model's context, capped at ENGINE_DEFAULTS.max_model_len
    description: str  # a few words for headers: "llama-3-8b on h100 (bf16)"
    # Limits of the server a calibration came from (`calibrate --url`): flag defaults give
    # way to them. Sorted (name, value) pairs; empty for the analytic model.
    server_limits: tuple[tuple[str, Any], ...] = ()
    quantization: str | None = None  # fp8: linear weights in one byte (QUANTIZATIONS)
    vllm_version: str | None = None  # the vLLM version whose kernel tables price steps
    kv_cache_dtype: str = "auto"  # resolved --kv-cache-dtype: auto (the dtype) or an fp8 one
    # The limits flags left unset take (max_model_len is the field above, this one's capped).
    engine_limits: EngineLimits = ENGINE_DEFAULTS
    # The description's text before and after the fitted model's coverage of the step shapes
    # (sim.cost.gpu_terms.coverage), which depends on the engine's token budget; None when no
    # fitted model prices the steps (the description then holds for any budget).
    coverage_frame: tuple[str, str] | None = None

    def description_at(self, budget_tokens: int) -> str:
        """The description with the fitted data's coverage stated for steps of up to
        `budget_tokens` tokens (`description` states it for ENGINE_DEFAULTS' budget)."""
        if self.coverage_frame is None or self.hardware is None:
            return self.description
        return _framed(self.coverage_frame, self.model.name, self.hardware.name, budget_tokens)

    def speculative_pricing(self, speculative: SpeculativeConfig | None
                            ) -> tuple[Backend, SpeculativeConfig | None, DrafterCost | None]:
        """What prices a run with `speculative`: the cost model with the verify floor and,
        for a drafter (draft model, EAGLE, MTP), its passes added to each step, the config
        marked as priced, and the drafter's cost; without speculation the cost model as it
        is (sim.cost.drafter). DrafterCostError names what a drafter lacks."""
        if speculative is None:
            return self.cost_model, None, None
        if speculative.method not in DRAFTER_METHODS:
            return SpeculativeCostModel(self.cost_model), speculative, None
        target = TargetPricing(self.cost_model, self.model, self.hardware, self.dtype,
                               self.parallel.tensor_parallel)
        drafter = drafter_cost(speculative, target)
        return (SpeculativeCostModel(self.cost_model, drafter),
                replace(speculative, drafter_priced=True), drafter)

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V bytes of one token over the whole model, in the KV cache's dtype."""
        return self.model.kv_bytes_per_token(kv_element_bytes(self.kv_cache_dtype, self.dtype))

    def to_dict(self) -> dict[str, Any]:
        """The deployment as JSON-ready data (what --json records)."""
        return {
            "description": self.description,
            "model": asdict(self.model) | {"num_params": self.model.num_params,
                                           "num_active_params": self.model.num_active_params},
            "hardware": None if self.hardware is None else
            {k: v for k, v in asdict(self.hardware).items() if k != "sources"},
            "dtype": self.dtype,
            "parallel": asdict(self.parallel),
            "kv_pool": asdict(self.kv_pool),
            "max_model_len": self.max_model_len,
            "cost_model": type(self.cost_model).__name__,
            "quantization": self.quantization,
            "kv_cache_dtype": self.kv_cache_dtype,
            "vllm_version": self.vllm_version,
            "server_limits": dict(self.server_limits),
        }


def build_deployment(options: DeploymentOptions) -> Deployment:
    """The Deployment the options describe; ValueError naming the option when it cannot be."""
    dtype = normalize_dtype(options.dtype)
    parallel = Parallelism(options.tensor_parallel, options.data_parallel,
                           options.expert_parallel)
    model = resolve_model(options.model)
    if model.quantization and not options.quantization:  # an FP8 checkpoint, as vLLM reads it
        options = replace(options, quantization=model.quantization)
    if options.kv_cache_dtype == "auto" and model.kv_cache_dtype:  # the checkpoint's KV scheme
        options = replace(options, kv_cache_dtype=model.kv_cache_dtype)
    kv_element_bytes(options.kv_cache_dtype, dtype)  # an unknown value, named
    if not 0.0 < options.gpu_memory_utilization <= 1.0:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got "
                         f"{options.gpu_memory_utilization}")
    if options.cost_model is not None:
        return _calibrated(options, model, dtype, parallel)
    hardware = hardware_spec(options.hardware)
    limits = ENGINE_DEFAULTS
    if options.vllm_defaults:
        limits = vllm_server_limits(hardware.name, hardware.memory_bytes,
                                    model.max_position_embeddings)
    cost = AnalyticCostModel(model, hardware, dtype, tensor_parallel=parallel.tensor_parallel,
                             allreduce_latency_s=hardware.interconnect_latency_s,
                             data_parallel=parallel.data_parallel,
                             expert_parallel=parallel.expert_parallel,
                             reserve_bytes=_reserve_bytes(options, model, dtype, parallel,
                                                          limits),
                             quantization=options.quantization,
                             kv_cache_dtype=options.kv_cache_dtype)
    block_bytes = model.kv_bytes_per_token(cost.kv_bytes) * options.block_size
    utilization = options.gpu_memory_utilization
    sized = cost.kv_pool_blocks(options.block_size, utilization)
    pool = KvPool(
        num_blocks=sized if options.num_blocks is None else options.num_blocks,
        block_size=options.block_size, block_bytes=block_bytes,
        sized_by="vllm" if options.num_blocks is None else "--num-blocks",
        gpu_memory_utilization=utilization, gpu_memory_bytes=hardware.memory_bytes,
        gpu_weight_bytes=cost.rank_weight_bytes, gpu_reserve_bytes=cost.reserve_bytes,
        gpu_kv_bytes=cost.kv_cache_bytes(utilization))
    priced, pricing, fitted, vllm_version = pick_cost_model(options, cost, model, hardware,
                                                            parallel, dtype)
    if model.is_mla:
        pricing += ("; latent attention priced with the attention terms fitted on standard "
                    "attention (extrapolated)")
    if model.attention_chunk_size:  # (sim.specs.model_specs: an upper bound past one chunk)
        pricing += (f"; attention local to {model.attention_chunk_size}-token chunks priced "
                    "as full attention (exact while a sequence fits one chunk)")
    pricing += "".join(f"; {note}" for note in pricing_notes(model))
    head = f"{_describe(options, parallel, dtype)}; priced by "
    frame, description = None, head + pricing
    if fitted is not None:  # the fitted model's coverage goes between its head and its notes
        frame = (head + fitted, pricing)
        description = _framed(frame, model.name, hardware.name, ENGINE_DEFAULTS.token_budget)
    return Deployment(model, hardware, dtype, parallel, pool, priced,
                      min(model.max_position_embeddings, limits.max_model_len), description,
                      quantization=options.quantization, vllm_version=vllm_version,
                      kv_cache_dtype=options.kv_cache_dtype, engine_limits=limits,
                      coverage_frame=frame)


def _framed(frame: tuple[str, str], model_name: str, gpu: str, budget_tokens: int) -> str:
    """A description whose fitted-data coverage is stated for steps up to budget_tokens."""
    before, after = frame
    return before + gpu_coverage(model_name, gpu, budget_tokens) + after


def _reserve_bytes(options: DeploymentOptions, model: ModelSpec, dtype: str,
                   parallel: Parallelism, limits: EngineLimits) -> int:
    """What vLLM's memory profile holds back on each GPU for these limits (sim.specs.kv_reserve)."""
    tokens = options.max_num_batched_tokens or limits.token_budget
    seqs = limits.max_num_seqs if options.max_num_seqs is None else options.max_num_seqs
    try:
        shape = ProfileShape(tokens, seqs)
    except ValueError as error:
        raise ValueError(f"--max-num-batched-tokens / --max-num-seqs: {error}") from None
    return vllm_reserve_bytes(model, shape, DTYPE_BYTES[dtype], parallel.tensor_parallel,
                              parallel.data_parallel, parallel.expert_parallel)


def _describe(options: DeploymentOptions, parallel: Parallelism, dtype: str) -> str:
    tp, dp = parallel.tensor_parallel, parallel.data_parallel
    gpus = f"{tp}x {options.hardware}" if tp > 1 else options.hardware
    if dp > 1:
        gpus += f", dp {dp}"
    if parallel.expert_parallel:
        gpus += " + ep"
    weights = f", {options.quantization} weights" if options.quantization else ""
    if options.kv_cache_dtype != "auto":
        weights += f", {options.kv_cache_dtype} KV cache"
    return f"{options.model} on {gpus} ({dtype}{weights})"


def _calibrated(options: DeploymentOptions, model: ModelSpec, dtype: str,
                parallel: Parallelism) -> Deployment:
    """A deployment whose steps come from a calibration file (its own pool and limits)."""
    if parallel != Parallelism() or options.quantization or options.kv_cache_dtype != "auto":
        raise ValueError("--tp / --data-parallel-size / --quantization / --kv-cache-dtype "
                         "price the analytic model; a calibration is measured as is")
    cost = CalibratedCostModel.load(options.cost_model)
    meta = cost.meta
    server = meta.get("server") or {}
    block_size = options.block_size  # a calibrated server's, unless given
    if block_size == ENGINE_DEFAULTS.block_size and server.get("block_size"):
        block_size = server["block_size"]
    if meta.get("block_size", block_size) != block_size:
        raise ValueError(f"{options.cost_model}: calibrated with block size "
                         f"{meta['block_size']}, --block-size is {block_size}")
    num_blocks = meta.get("num_blocks", 4096) if options.num_blocks is None else options.num_blocks
    pool = KvPool(num_blocks, block_size,
                  model.kv_bytes_per_token(DTYPE_BYTES[dtype]) * block_size,
                  "calibration" if options.num_blocks is None else "--num-blocks")
    return Deployment(model, None, dtype, parallel, pool, cost,
                      meta.get("max_model_len", 2048),
                      f"calibrated {meta.get('model', '?')} on {meta.get('hardware', '?')}",
                      tuple(sorted((k, v) for k, v in server.items() if v is not None)))
