"""Turn a BatchPlan into the index tensors of one ragged forward (StepInputs).

All T tokens of a step are flattened into rows for the linear layers (P >= T rows: steps
with a prefill chunk round up to PREFILL_ROW_MULTIPLE). The native attention kernel
(`paged=True`) takes each row's sequence, position and the block tables as they are. For
the torch path's attention the sequences form groups (one-token rows apart from prefill
chunks, split by context length in powers of two), each padded to `q_pad` query rows and
`kv_pad` keys so one batched matmul serves the group. The padding rules keep every row's
arithmetic independent of its batch (see attention.py): `q_pad * group_size >=
MIN_GEMM_ROWS`, `kv_pad % KV_PAD_MULTIPLE == 0`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from executor.config import ModelArgs
from sim.engine.block_manager import BlockManager
from sim.engine.core import BatchPlan, Request

MIN_GEMM_ROWS = 4  # MKL picks other kernels below 4 rows; pad attention matmuls to >= 4
KV_PAD_MULTIPLE = 16  # keys padded to whole SIMD vectors, so softmax sums never change order
# Sequences are grouped by context length in powers of two from here up, so one long
# context does not make every short one gather and attend over its padding.
BUCKET_MIN_CONTEXT = 64
# A step with a prefill chunk runs its linear layers over a row count rounded up to this:
# oneDNN builds a kernel per new row count (~0.45 ms per layer the first time, 7 ms a step
# for the peer model), and prefill steps would otherwise bring a new count nearly every time.
PREFILL_ROW_MULTIPLE = 16


@dataclass(slots=True)
class Segment:
    """One sequence's share of a step: n tokens at positions c..c+n-1."""

    request: Request
    start: int  # c: tokens already in the KV cache
    num_tokens: int  # n
    samples: bool  # the step ends the sequence (c + n == num_tokens, proposals aside)
    # Speculative decoding: proposals computed after the sequence's last token (the last
    # len(drafts) of the n tokens), each with its own logits row.
    drafts: list[int] = field(default_factory=list)


@dataclass(slots=True)
class AttnGroup:
    """Sequences attended in one batched matmul, padded to q_pad queries and kv_pad keys."""

    kv_slabs: torch.Tensor  # [2 * Hkv * B * nblk]: (K|V head, block) rows, head-major, 0-padded
    q_index: torch.Tensor  # [B * q_pad] step row of each query (pads repeat the last row)
    bias: torch.Tensor  # [B, q_pad, kv_pad] float32: 0 where the key is visible, else -inf
    out_index: torch.Tensor  # [R] index into the B * q_pad queries of each real row
    rows: torch.Tensor  # [R] step row of each real query
    num_seqs: int
    q_pad: int
    kv_pad: int


@dataclass(slots=True)
class StepInputs:
    """Everything one forward needs besides weights and the KV cache."""

    token_ids: torch.Tensor  # [P] the T real tokens, then P - T pad rows (token 0)
    positions: torch.Tensor  # [P]
    slots: torch.Tensor  # [T] KV slot of each real token: block_id * block_size + offset
    logit_rows: torch.Tensor  # [S] rows whose logits are computed
    groups: list[AttnGroup]  # the torch attention path's groups; empty with `paged`
    num_tokens: int  # T (P is T rounded up to PREFILL_ROW_MULTIPLE if a prefill chunk runs)
    # The native attention kernel's inputs (build_step_inputs(paged=True)), else None:
    tables: torch.Tensor | None = None  # [B, width] int64 block ids of each sequence
    row_seq: torch.Tensor | None = None  # [T] int64 sequence of each real row


def segments_from_plan(plan: BatchPlan) -> list[Segment]:
    """The plan's sequences in order; static padding rows recompute their last position."""
    segments = []
    spec = plan.spec_token_ids
    for request in plan.requests:
        start = request.num_computed_tokens
        n = plan.num_scheduled_tokens[request.request_id]
        drafts = spec.get(request.request_id) if spec else None
        if drafts:
            segments.append(Segment(request, start, n, True, drafts))
        else:
            segments.append(Segment(request, start, n, start + n == request.num_tokens))
    for request in plan.padding:
        segments.append(Segment(request, request.num_tokens - 1, 1, False))
    return segments


def _token_slice(request: Request, start: int, n: int) -> list[int]:
    """Tokens start..start+n-1 of prompt + output, without copying the whole sequence."""
    prompt = request.prompt_token_ids
    if prompt is None:
        raise ValueError(f"request {request.request_id} has no prompt_token_ids")
    p, out = len(prompt), request.output_token_ids
    if start + n > p + len(out):
        raise ValueError(f"request {request.request_id}: step asks for tokens "
                         f"{start}..{start + n - 1} of a {p + len(out)}-token sequence")
    if start + n <= p:
        return prompt[start:start + n]
    if start >= p:
        return out[start - p:start - p + n]
    return prompt[start:] + out[:start + n - p]


def build_step_inputs(segments: list[Segment], block_manager: BlockManager, args: ModelArgs,
                      device: torch.device, all_logits: bool = False,
                      paged: bool = False) -> StepInputs:
    """Flatten segments into StepInputs; all_logits computes logits for every row (tests).

    paged: attention reads the block tables directly (the native kernel, Transformer.native);
    otherwise the torch path's padded groups are built."""
    bs = block_manager.block_size
    starts = np.fromiter((s.start for s in segments), np.int64, len(segments))
    lens = np.fromiter((s.num_tokens for s in segments), np.int64, len(segments))
    ends = np.cumsum(lens)
    row_start = ends - lens
    total = int(ends[-1])
    seq_of_row = np.repeat(np.arange(len(segments)), lens)
    positions = np.arange(total) + (starts - row_start)[seq_of_row]
    kv_step = KV_PAD_MULTIPLE // math.gcd(bs, KV_PAD_MULTIPLE)  # blocks per pad unit
    need = -(-(starts + lens) // bs)  # blocks covering each context
    tables = np.zeros((len(segments), int(need.max()) + kv_step), dtype=np.int64)
    for i, segment in enumerate(segments):
        table = block_manager.block_table(segment.request.request_id)[: need[i]]
        tables[i, : len(table)] = table
    slots = tables[seq_of_row, positions // bs] * bs + positions % bs
    tokens = [t for s in segments
              for t in _token_slice(s.request, s.start, s.num_tokens - len(s.drafts)) + s.drafts]
    if all_logits:
        logit_rows = np.arange(total)
    elif any(s.drafts for s in segments):
        logit_rows = _verify_rows(segments, ends)
    else:
        logit_rows = (ends - 1)[np.fromiter((s.samples for s in segments), bool, len(segments))]
    groups = [] if paged else _groups(starts, lens, row_start, tables, need, bs, kv_step,
                                       args, block_manager.num_blocks, device)
    rows = total
    if lens.max() > 1:
        rows = -(-total // PREFILL_ROW_MULTIPLE) * PREFILL_ROW_MULTIPLE
    token_ids = np.zeros(rows, dtype=np.int64)
    token_ids[:total] = tokens
    return StepInputs(
        token_ids=_tensor(token_ids, device),
        positions=_tensor(np.pad(positions, (0, rows - total)), device),
        slots=_tensor(slots, device), logit_rows=_tensor(logit_rows, device), groups=groups,
        num_tokens=total,
        tables=_tensor(tables, device) if paged else None,
        row_seq=_tensor(seq_of_row, device) if paged else None,
    )


def _verify_rows(segments: list[Segment], ends: np.ndarray) -> np.ndarray:
    """Logits rows of a step with proposals: each sampling sequence's last row, and a
    verifying one's rows from its last token on (1 + its proposals)."""
    rows = [row for s, end in zip(segments, ends.tolist(), strict=True) if s.samples
            for row in range(end - 1 - len(s.drafts), end)]
    return np.asarray(rows, dtype=np.int64)


def _groups(starts: np.ndarray, lens: np.ndarray, row_start: np.ndarray, tables: np.ndarray,
            need: np.ndarray, bs: int, kv_step: int, args: ModelArgs, pool_blocks: int,
            device: torch.device) -> list[AttnGroup]:
    """The torch attention path's groups: one-token rows and prefill chunks apart, each split
    by context length in powers of two."""
    q_min = -(-MIN_GEMM_ROWS // args.group_size)
    bucket = np.ceil(np.log2(np.maximum(starts + lens, BUCKET_MIN_CONTEXT))).astype(np.int64)
    groups = []
    for member in (lens == 1, lens > 1):
        for key in np.unique(bucket[member]):
            idx = np.flatnonzero(member & (bucket == key))
            groups.append(_group(idx, starts, lens, row_start, tables, need, bs, kv_step,
                                 q_min, args, pool_blocks, device))
    return groups


def _tensor(array: np.ndarray, device: torch.device) -> torch.Tensor:
    """A step-owned numpy array as a tensor: shared memory on CPU, one copy to a GPU."""
    tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor if device.type == "cpu" else tensor.to(device, non_blocking=True)


def _group(idx: np.ndarray, starts: np.ndarray, lens: np.ndarray, row_start: np.ndarray,
           tables: np.ndarray, need: np.ndarray, bs: int, kv_step: int, q_min: int,
           args: ModelArgs, pool_blocks: int, device: torch.device) -> AttnGroup:
    n, c, first = lens[idx], starts[idx], row_start[idx]
    q_pad = max(int(n.max()), q_min)
    num_blocks = -(-int(need[idx].max()) // kv_step) * kv_step
    kv_pad = num_blocks * bs
    q_off = np.minimum(np.arange(q_pad), (n - 1)[:, None])  # [B, q_pad]; pads repeat the last
    limits = (c[:, None] + q_off)[:, :, None]  # last visible key position of each query
    keys = np.arange(kv_pad)
    visible = keys <= limits  # [B, q_pad, kv_pad]
    if args.sliding_window is not None:
        visible &= keys > limits - args.sliding_window
    # Adding 0 leaves a score bit-exact; an additive mask is ~10x faster than masked_fill.
    bias = np.where(visible, np.float32(0.0), np.float32(-np.inf))
    seq = np.repeat(np.arange(len(idx)), n)
    within = np.arange(len(seq)) - np.repeat(np.cumsum(n) - n, n)
    return AttnGroup(
        kv_slabs=_tensor(_kv_slabs(tables[idx, :num_blocks], args.n_kv_heads, pool_blocks),
                         device),
        q_index=_tensor((first[:, None] + q_off).reshape(-1), device),
        bias=_tensor(bias, device), out_index=_tensor(seq * q_pad + within, device),
        rows=_tensor(first[seq] + within, device),
        num_seqs=len(idx), q_pad=q_pad, kv_pad=kv_pad,
    )


def _kv_slabs(blocks: np.ndarray, n_kv_heads: int, pool_blocks: int) -> np.ndarray:
    """Rows of a layer's cache viewed [2 * Hkv * num_blocks, block_size * D] holding the
    group's blocks [B, nblk], for every K then V head: [2 * Hkv * B * nblk]."""
    heads = np.arange(2 * n_kv_heads, dtype=np.int64)[:, None] * pool_blocks
    return (heads + blocks.reshape(1, -1)).reshape(-1)
