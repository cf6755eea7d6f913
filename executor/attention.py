"""Paged attention over a ragged batch: one batched matmul per group of sequences.

Each group gathers its sequences' KV blocks into [n_kv_heads * B, kv_pad, D] and its queries
into [n_kv_heads * B, q_pad * group_size, D] (GQA heads folded into the matmul rows), then
runs masked softmax attention. Batch invariance (a row's result never depends on the other
sequences or on the padding) rests on three rules, each checked by tests/executor:
- every matmul has >= 4 rows (batch.MIN_GEMM_ROWS): below that MKL switches kernels;
- keys are padded to whole SIMD vectors with -inf scores, so softmax adds exact zeros;
- P @ V runs over fixed chunks of PV_CHUNK keys, summed in order: MKL splits longer
  reductions at length-dependent points, one chunk is always one block.
"""

from __future__ import annotations

import torch

from executor.batch import AttnGroup

PV_CHUNK = 128  # keys per P @ V matmul; MKL keeps reductions up to 192 long in one block


def gather_kv(cache: torch.Tensor, group: AttnGroup) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's keys and values for a group, each [n_kv_heads * B, kv_pad, D]."""
    heads2, blocks, size, dim = cache.shape
    # Whole (head, block) slabs picked along dim 0 copy twice as fast as along the block dim.
    picked = cache.view(heads2 * blocks, size * dim).index_select(0, group.kv_slabs)
    kv = picked.view(2, heads2 // 2 * group.num_seqs, group.kv_pad, dim)
    return kv[0], kv[1]


def group_attention(q: torch.Tensor, cache: torch.Tensor, group: AttnGroup,
                    scale: float) -> torch.Tensor:
    """Attention of one group's queries; returns [R, n_heads * D] for its real rows."""
    _, n_heads, dim = q.shape
    n_kv = cache.shape[0] // 2
    g, b, qp = n_heads // n_kv, group.num_seqs, group.q_pad
    # [B * q_pad, H, D] -> [Hkv, B, q_pad, G, D] -> [Hkv * B, q_pad * G, D]
    qg = q.index_select(0, group.q_index).view(b, qp, n_kv, g, dim)
    qg = qg.permute(2, 0, 1, 3, 4).reshape(n_kv * b, qp * g, dim).mul_(scale)
    keys, values = gather_kv(cache, group)  # [Hkv * B, L, D] each
    scores = torch.bmm(qg, keys.transpose(1, 2)).float()  # [Hkv * B, q_pad * G, L]
    bias = group.bias[None, :, :, None, :]  # [1, B, q_pad, 1, L]
    scores.view(n_kv, b, qp, g, group.kv_pad).add_(bias)
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = None
    for lo in range(0, group.kv_pad, PV_CHUNK):
        part = torch.bmm(probs[:, :, lo:lo + PV_CHUNK], values[:, lo:lo + PV_CHUNK])
        out = part if out is None else out.add_(part)
    # [Hkv * B, q_pad * G, D] -> [B * q_pad, H * D] -> real rows [R, H * D]
    out = out.view(n_kv, b, qp, g, dim).permute(1, 2, 0, 3, 4).reshape(b * qp, n_heads * dim)
    return out.index_select(0, group.out_index)


def paged_attention(q: torch.Tensor, cache: torch.Tensor, groups: list[AttnGroup],
                    scale: float, num_tokens: int) -> torch.Tensor:
    """Attention for all P step rows, q [P, H, D] -> [P, H * D]; KV already written.
    Rows past num_tokens (StepInputs padding) come out as zeros."""
    if len(groups) == 1 and num_tokens == q.shape[0]:  # one group holds every row, in order
        return group_attention(q, cache, groups[0], scale)
    out = q.new_zeros(q.shape[0], q.shape[1] * q.shape[2])
    for group in groups:
        out.index_copy_(0, group.rows, group_attention(q, cache, group, scale))
    return out
