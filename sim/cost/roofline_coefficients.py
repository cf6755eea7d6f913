"""The per-unit times behind AnalyticCostModel.predict, from a model's shape and a GPU.

Dense layers: every token runs every linear weight. Mixture of experts: a token runs its
num_experts_per_tok experts, and a step reads only the experts its tokens reach (the
expected number for a batch, sim.cost.roofline_coefficients.expected_active_experts). Parallelism as
vLLM does it: tensor parallel splits every matrix over tp GPUs; expert parallel keeps each
expert whole on one of tp x dp GPUs, and the data-parallel ranks exchange hidden states
around every MoE layer.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sim.cost.roofline import AnalyticCostModel
    from sim.engine.core import BatchPlan
    from sim.specs.hardware import HardwareSpec
    from sim.specs.model_specs import ModelSpec

# FlashAttention's forward pass tiles the queries in blocks of 128 rows and streams the
# context's K/V from HBM once per tile, so a prefill chunk of n tokens over a context of c
# reads about n * c / 128 tokens of KV (exact once n >= 128; an undercount below that).
ATTN_QUERY_TILE_ROWS = 128


def expected_active_experts(num_experts: int, experts_per_tok: int, tokens: int) -> float:
    """Experts (of num_experts) that at least one of `tokens` tokens is routed to, expected
    under uniform routing: each token picks experts_per_tok distinct experts, so one expert
    is missed by a token with probability 1 - k/E."""
    return num_experts * (1.0 - (1.0 - experts_per_tok / num_experts) ** tokens)


def check_parallel(model: ModelSpec, hardware: HardwareSpec, tp: int, dp: int,
                   expert_parallel: bool) -> None:
    """Raise unless the GPUs can split `model` the way vLLM's tensor and expert parallelism do."""
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
    if dp < 1:
        raise ValueError(f"AnalyticCostModel: data_parallel must be >= 1, got {dp}")
    if expert_parallel and not model.is_moe:
        raise ValueError(f"AnalyticCostModel: expert parallel needs experts; {model.name} "
                         "is dense")
    if expert_parallel and model.num_experts % (tp * dp):
        raise ValueError(f"AnalyticCostModel: {model.num_experts} experts of {model.name} do "
                         f"not split over tp x dp = {tp * dp} GPUs")


def rank_weight_bytes(cost: AnalyticCostModel) -> int:
    """Weight bytes one GPU holds: 1/tp of the dense weights, and 1/tp of every expert or
    (expert parallel) a whole 1/(tp x dp) share of the experts; linear layers at
    cost.linear_bytes a weight (1 under FP8 quantization)."""
    spec = cost.model
    experts = spec.expert_params_total
    expert_shards = cost.tensor_parallel * (cost.data_parallel if cost.expert_parallel else 1)
    dense = spec.num_params - experts
    if cost.linear_bytes == cost.dtype_bytes and spec.expert_quantization is None:
        return (dense // cost.tensor_parallel + experts // expert_shards) * cost.dtype_bytes
    expert_bytes = int(experts * spec.expert_weight_bytes(cost.linear_bytes))
    dense_bytes = spec.weight_bytes(cost.dtype_bytes, cost.linear_bytes) - expert_bytes
    return dense_bytes // cost.tensor_parallel + expert_bytes // expert_shards


def coefficients(cost: AnalyticCostModel, dtype_bytes: int) -> dict[str, float | int]:
    """The constant per-unit times behind `predict`, and the byte sizes they come from."""
    spec, tp = cost.model, cost.tensor_parallel
    flops_s = cost.hardware.flops_for(cost.dtype) * cost.flops_efficiency  # one GPU's
    # The linear layers' GEMMs: FP8 tensor cores under FP8 quantization (weights and
    # activations in FP8), else the dtype's.
    linear_flops_s = (cost.hardware.flops_for(cost.quantization or cost.dtype)
                      * cost.flops_efficiency)
    bytes_s = cost.hardware.mem_bandwidth_bytes_s * cost.bandwidth_efficiency  # one GPU's
    linear_bytes = cost.linear_bytes
    embed_params = spec.vocab_size * spec.hidden_size  # one vocab x hidden matrix
    num_matrices = 1 if spec.tie_word_embeddings else 2  # input embedding, lm_head
    # Every token's GEMMs: the dense linear weights and the experts it is routed to.
    linear_params = spec.num_active_params - num_matrices * embed_params
    # A step reads every dense weight once, except the input embedding: only the rows of
    # this step's tokens are gathered. A tied matrix is read in full as the lm_head. Expert
    # weights are read per step by the experts its tokens reach (predict adds them).
    read_params = spec.num_params - spec.expert_params_total - (num_matrices - 1) * embed_params
    dense_linear = spec.quantizable_params - spec.expert_params_total  # (of read_params)
    read_bytes = (read_params - dense_linear) * dtype_bytes + dense_linear * linear_bytes
    # Each GPU stores K/V for ceil(num_kv_heads / tp) heads: a slice of them while
    # tp <= num_kv_heads, one replicated head beyond that (as vLLM does), at the KV cache's
    # element bytes (--kv-cache-dtype), which every KV write, read and swap moves.
    kv_heads_per_gpu = math.ceil(spec.num_kv_heads / tp)
    gpu_kv_bytes_per_token = (
        spec.kv_bytes_per_token(cost.kv_bytes) // spec.num_kv_heads * kv_heads_per_gpu
    )
    if spec.is_mla:  # the latent is not split by head: every GPU holds it whole
        gpu_kv_bytes_per_token = spec.kv_bytes_per_token(cost.kv_bytes)
    # QK^T and PV: 2 FLOPs per multiply-add, 2 matmuls, over every query head's head_dim.
    # A prefill chunk counts its full chunk x context rectangle although a causal kernel
    # skips about half of a first chunk's square; attention kernels also run below GEMM
    # efficiency (FlashAttention-2 forward ~50-70% of peak), and the two roughly cancel.
    # (MLA: queries and keys of head_dim, values of v_head_dim, as its prefill runs them.)
    value_dim = spec.v_head_dim if spec.is_mla else spec.head_dim
    # (Per full-attention layer; sliding-window layers add their windowed pairs, in the
    # same units, through windowed_sums.)
    attn_flops_per_pair = (2 * spec.num_full_attention_layers * spec.num_heads
                           * (spec.head_dim + value_dim))
    # The tp GPUs run in lockstep, each on its 1/tp of the FLOPs and weight bytes, so a
    # step takes one GPU's time (norm weights, replicated on every GPU, are < 0.01%).
    return {
        "dtype_bytes": dtype_bytes,
        "weight_bytes": spec.weight_bytes(dtype_bytes, linear_bytes),
        "gpu_kv_bytes_per_token": gpu_kv_bytes_per_token,
        "_compute_s_per_token": 2 * linear_params / tp / linear_flops_s,
        "_compute_s_per_attn_pair": attn_flops_per_pair / tp / flops_s,
        # lm_head runs only for rows that sample: the last position of each sequence.
        "_compute_s_per_sampled_row": 2 * embed_params / tp / flops_s,
        "_memory_s_weights": read_bytes / tp / bytes_s,
        # Each new token writes its K/V once; each decode reads its whole context once.
        "_memory_s_per_kv_token": gpu_kv_bytes_per_token / bytes_s,
        "_memory_s_per_prefill_pair": gpu_kv_bytes_per_token / ATTN_QUERY_TILE_ROWS / bytes_s,
        **_comm_coefficients(cost, dtype_bytes),
        **_expert_coefficients(cost, spec.expert_weight_bytes(linear_bytes), bytes_s),
        # Each GPU moves its own share of a token's KV over its own PCIe link, in parallel.
        "_swap_s_per_token": gpu_kv_bytes_per_token / cost.hardware.host_link_bytes_s,
        **_window_coefficients(spec),
    }


def _window_coefficients(spec: ModelSpec) -> dict[str, float | int]:
    """Sliding-window layers per full-attention layer (their K/V heads alike), and the
    window: windowed_sums adds their attention to the full layers' sums."""
    return {"_window_ratio": spec.num_sliding_layers / spec.num_full_attention_layers,
            "_window": spec.sliding_window}


def windowed_sums(cost: AnalyticCostModel, plan: BatchPlan,
                  tokens: int) -> tuple[float, float, float]:
    """A plan's prefill pairs, decode KV tokens and KV tokens written, in full-attention
    layer units with the sliding-window layers added: a sliding layer reads at most
    `window` tokens a row and pairs at most `window` keys with a query. From the plan's
    totals: min(sum of contexts, rows x window) for decodes and min(pairs, prefill tokens
    x window) for prefill, exact when every row's context reaches past the window (an
    upper bound below it)."""
    ratio, window = cost._window_ratio, cost._window
    prefill = plan.prefill_attn
    decode = plan.decode_context
    return (prefill + ratio * min(prefill, plan.prefill_tokens * window),
            decode + ratio * min(decode, plan.decode_seqs * window),
            tokens * (1.0 + ratio))


def _expert_coefficients(cost: AnalyticCostModel, dtype_bytes: float,
                         bytes_s: float) -> dict[str, float | int]:
    """What expert_weights_s needs: experts one GPU holds, and seconds to read each
    (dtype_bytes: an expert weight's bytes)."""
    spec = cost.model
    if not spec.is_moe:
        return {"_local_experts": 0, "_expert_read_s": 0.0, "_expert_token_scale": 1}
    if cost.expert_parallel:
        # Each GPU holds num_experts / (tp x dp) whole experts and, with every rank running
        # a step of the same size, sees the tokens of all dp ranks.
        ranks = cost.tensor_parallel * cost.data_parallel
        local, shard, scale = spec.num_experts // ranks, 1, cost.data_parallel
    else:  # every GPU holds 1/tp of every expert and sees its own rank's tokens
        local, shard, scale = spec.num_experts, cost.tensor_parallel, 1
    return {
        "_local_experts": local,
        "_expert_read_s": spec.num_moe_layers * spec.expert_params * dtype_bytes / shard / bytes_s,
        "_expert_token_scale": scale,
    }


def _comm_coefficients(cost: AnalyticCostModel, dtype_bytes: int) -> dict[str, float]:
    """Seconds of communication per token, sampled row and step; 0 on one GPU."""
    tp, spec = cost.tensor_parallel, cost.model
    link_bytes_s = cost.hardware.interconnect_bytes_s
    per_token = per_row = per_step = 0.0
    if tp > 1:
        # Row-parallel attention output and MLP down projections each all-reduce the
        # [tokens, hidden] activations; the vocab-parallel embedding adds one more.
        num_allreduces = 2 * spec.num_layers + 1
        # A ring all-reduce sends and receives 2 (tp - 1) / tp of the buffer on every link.
        ring_bytes_per_token = 2 * (tp - 1) / tp * spec.hidden_size * dtype_bytes
        # The vocab-parallel lm_head's logits, [rows, vocab / tp] on each GPU, are gathered
        # to the sampling GPU, which receives (tp - 1) / tp of each row through its own link.
        per_token = num_allreduces * ring_bytes_per_token / link_bytes_s
        per_row = (tp - 1) / tp * spec.vocab_size * dtype_bytes / link_bytes_s
        per_step = (num_allreduces + 1) * cost.allreduce_latency_s  # + the gather
    dp = cost.data_parallel
    if cost.expert_parallel and dp > 1:
        # vLLM's default all2all backend (allgather_reducescatter): around each MoE layer a
        # rank gathers the other dp - 1 ranks' hidden states and scatters their partial
        # outputs back, (dp - 1) x hidden bytes each way per token of a same-sized step.
        per_token += (spec.num_moe_layers * 2 * (dp - 1) * spec.hidden_size * dtype_bytes
                      / link_bytes_s)
        per_step += 2 * spec.num_moe_layers * cost.allreduce_latency_s
    return {"_comm_s_per_token": per_token, "_comm_s_per_sampled_row": per_row,
            "_comm_s_per_step": per_step}
