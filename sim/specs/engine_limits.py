"""The engine's limits when none is given (vLLM's defaults), and KV blocks from bytes: the one
home the flags, the scheduler, the deployment and the KV reserve all read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineLimits:
    """What bounds one engine: its KV block, running requests, request length, step size."""

    block_size: int = 16  # tokens per KV block: vLLM's on CUDA
    max_num_seqs: int = 256  # most requests running at once (vLLM's max_num_seqs)
    max_model_len: int = 8192  # prompt + output a request may reach; caps a model's context
    # Most tokens one step computes when prompts are chunked: vLLM's max_num_batched_tokens
    # (`--token-budget` is the same knob), its long-standing chunked-prefill default and what
    # `vllm serve` takes on GPUs under 70 GiB. vLLM's memory profile runs a step this large.
    token_budget: int = 2048
    # vLLM's limits for a named GPU (vllm_server_limits): prefills always chunked, the
    # budget applying to chunked steps only.
    vllm: bool = False

    def __post_init__(self) -> None:
        for key in ("block_size", "max_num_seqs", "max_model_len", "token_budget"):
            if getattr(self, key) < 1:
                raise ValueError(f"engine limits: {key} must be >= 1, got {getattr(self, key)}")


ENGINE_DEFAULTS = EngineLimits()

# `vllm serve`'s limits on a large GPU (vLLM 0.10.1, EngineArgs._set_default_args for the
# OpenAI API server): 70 GiB or more of device memory, A100s excepted (larger steps cost an
# A100 throughput). Smaller GPUs take ENGINE_DEFAULTS' budget and sequence cap.
VLLM_LARGE_GPU_BYTES = 70 * 2**30
VLLM_LARGE_GPU_SEQS = 1024
VLLM_LARGE_GPU_TOKENS = 8192


def vllm_server_limits(gpu_name: str, gpu_memory_bytes: int, context_len: int) -> EngineLimits:
    """The limits `vllm serve` (V1) picks on this GPU: token budget and sequence cap by the
    GPU's memory, max_model_len the model's whole context, block size 16."""
    large = gpu_memory_bytes >= VLLM_LARGE_GPU_BYTES and "a100" not in gpu_name.lower()
    if not large:
        return EngineLimits(max_num_seqs=ENGINE_DEFAULTS.max_num_seqs, max_model_len=context_len,
                            token_budget=ENGINE_DEFAULTS.token_budget, vllm=True)
    return EngineLimits(max_num_seqs=VLLM_LARGE_GPU_SEQS, max_model_len=context_len,
                        token_budget=VLLM_LARGE_GPU_TOKENS, vllm=True)


def kv_blocks(memory_bytes: float, block_bytes: int) -> int:
    """Whole KV blocks of `block_bytes` that `memory_bytes` of memory holds."""
    if block_bytes < 1:
        raise ValueError(f"kv_blocks: block_bytes must be >= 1, got {block_bytes}")
    return int(memory_bytes) // block_bytes
