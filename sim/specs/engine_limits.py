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

    def __post_init__(self) -> None:
        for key in ("block_size", "max_num_seqs", "max_model_len", "token_budget"):
            if getattr(self, key) < 1:
                raise ValueError(f"engine limits: {key} must be >= 1, got {getattr(self, key)}")


ENGINE_DEFAULTS = EngineLimits()


def kv_blocks(memory_bytes: float, block_bytes: int) -> int:
    """Whole KV blocks of `block_bytes` that `memory_bytes` of memory holds."""
    if block_bytes < 1:
        raise ValueError(f"kv_blocks: block_bytes must be >= 1, got {block_bytes}")
    return int(memory_bytes) // block_bytes
