"""The memory vLLM's start-up profile holds back from the KV cache on each GPU, term by term.

vLLM (v1 `Worker.determine_available_memory`, `memory_profiling` in vllm/utils/mem_utils.py)
runs one forward of max_num_batched_tokens dummy tokens and a sampler pass, then gives the
KV cache `utilization x memory - weights - non-torch increase - torch peak increase`. Each
term below is a function of the deployment; docs/deployment.md applies them by hand.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.specs.engine_limits import ENGINE_DEFAULTS
from sim.specs.model_specs import ModelSpec

# Non-torch memory one GPU gains from engine creation to the end of the profile (cuBLAS and
# attention workspaces, the compiler's and allocator's buffers; the CUDA context is already
# in the baseline snapshot, so it is not subtracted). Set from one measurement: vLLM 0.19
# gave Llama-3.1-8B on an RTX 4090 (0.9 x 25,250,627,584 B, 2,048 tokens, 256 sequences)
# 2,588 blocks, a reserve of 1.153 GiB, of which the activation peak below is 0.795 GiB.
NON_TORCH_BYTES = 366 * 2**20
# Communication buffers per process group a GPU shares with peers (the tensor-parallel
# group; the data/expert-parallel group): NCCL's per-channel, per-peer buffers for its three
# protocols (NCCL_BUFFSIZE 4 MiB for Simple) and vLLM's custom all-reduce buffers. An
# estimate, not a measurement.
COMM_GROUP_BYTES = 256 * 2**20
# Bytes per logits element at the sampler's peak: the bf16/fp16 logits, their fp32 copy,
# fp32 log-probs, and the top-k/top-p sort's fp32 values, int64 indices and fp32 probs
# (vLLM's v1 Sampler, which the profile runs with top-k, top-p and logprobs on).
SAMPLER_BYTES_PER_LOGIT_ELEMENT = 2 + 4 + 4 + 4 + 8 + 4


@dataclass(frozen=True)
class ProfileShape:
    """What the profile runs: tokens of one forward and sequences sampled, on one GPU
    (servelab's default limits unless given)."""

    max_num_batched_tokens: int = ENGINE_DEFAULTS.token_budget
    max_num_seqs: int = ENGINE_DEFAULTS.max_num_seqs

    def __post_init__(self) -> None:
        for key in ("max_num_batched_tokens", "max_num_seqs"):
            if getattr(self, key) < 1:
                raise ValueError(f"KV reserve: {key} must be >= 1, got {getattr(self, key)}")


def non_torch_bytes(tensor_parallel: int, data_parallel: int) -> int:
    """Non-torch increase: the workspaces, plus communication buffers for each group with
    peers (vLLM's `non_torch_increase`, `diff_from_create.non_torch_memory`)."""
    groups = (tensor_parallel > 1) + (data_parallel > 1)
    return NON_TORCH_BYTES + groups * COMM_GROUP_BYTES


def dense_layer_peak_bytes(spec: ModelSpec, tokens: int, dtype_bytes: int, tp: int,
                           mlp_width: int) -> int:
    """One dense layer's live tensors at its peak, on one GPU: hidden state and residual
    [T, h], then the larger of attention (QKV [T, (q+2kv)/tp x d] and its output
    [T, q/tp x d]) and the MLP (gate/up [T, 2I/tp] and the activation [T, I/tp])."""
    h, d = spec.hidden_size, spec.head_dim
    heads = -(-spec.num_heads // tp)
    kv_heads = -(-spec.num_kv_heads // tp)
    attention = (heads + 2 * kv_heads) * d + heads * d
    mlp = spec.mlp_matrices * (mlp_width // tp)  # gate and up (gated), then activation
    return tokens * (2 * h + max(attention, mlp)) * dtype_bytes


def moe_layer_peak_bytes(spec: ModelSpec, tokens: int, dtype_bytes: int, tp: int, dp: int,
                         expert_parallel: bool) -> int:
    """One MoE layer's live tensors at its peak, on one GPU. With dp > 1 the hidden states
    of every rank are gathered ([dp x T, h]); the router scores them ([dp T, E]) and the
    fused-MoE workspaces hold each routed row (dp T x k): gate/up [2I/s], activation [I/s]
    and down output [h], s the ways an expert is split (tp x dp, or 1 with expert parallel);
    a shared expert adds its own gate/up and activation [dp T, 3I_shared/tp]."""
    h, k, width = spec.hidden_size, spec.num_experts_per_tok, spec.moe_intermediate_size
    gathered = tokens * dp
    split = 1 if expert_parallel else tp * dp
    routed = gathered * k * (3 * (width // split) + h)
    shared_mlp = gathered * spec.mlp_matrices * (spec.shared_expert_intermediate_size // tp)
    hidden = tokens * 2 * h + (gathered * h if dp > 1 else 0)
    return (hidden + gathered * spec.num_experts + routed + shared_mlp) * dtype_bytes


def sampler_peak_bytes(spec: ModelSpec, shape: ProfileShape) -> int:
    """The sampler pass: logits of min(max_num_seqs, tokens) rows over the whole vocabulary
    (gathered on every GPU), with its fp32 copies (vLLM's `_dummy_sampler_run`)."""
    rows = min(shape.max_num_seqs, shape.max_num_batched_tokens)
    return rows * spec.vocab_size * SAMPLER_BYTES_PER_LOGIT_ELEMENT


def activation_peak_bytes(spec: ModelSpec, shape: ProfileShape, dtype_bytes: int, tp: int,
                          dp: int, expert_parallel: bool) -> int:
    """Torch peak increase of the profile: the largest layer's transient tensors at
    max_num_batched_tokens, or the sampler pass after the forward, whichever is larger."""
    tokens = shape.max_num_batched_tokens
    layer = 0
    if spec.num_layers > spec.num_moe_layers:
        layer = dense_layer_peak_bytes(spec, tokens, dtype_bytes, tp, spec.intermediate_size)
    if spec.is_moe:
        layer = max(layer, moe_layer_peak_bytes(spec, tokens, dtype_bytes, tp, dp,
                                                expert_parallel))
    return max(layer, sampler_peak_bytes(spec, shape))


def vllm_reserve_bytes(spec: ModelSpec, shape: ProfileShape, dtype_bytes: int, tp: int = 1,
                       dp: int = 1, expert_parallel: bool = False) -> int:
    """Bytes vLLM 0.19's profile holds back on each GPU besides weights: non-torch increase
    plus activation peak. CUDA graphs are captured after the KV cache from the memory above
    the utilization; 0.19 subtracts their estimate only with
    VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 (off by default), so they are not here."""
    return (non_torch_bytes(tp, dp)
            + activation_peak_bytes(spec, shape, dtype_bytes, tp, dp, expert_parallel))
