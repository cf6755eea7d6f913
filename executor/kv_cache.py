"""Paged K/V tensors, one pair per layer, addressed by the scheduler's BlockManager tables.

Token t of a request lives in block table[t // block_size], offset t % block_size; its slot
is block_id * block_size + offset. The layout is head-major, [n_kv_heads, num_blocks,
block_size, head_dim], so gathering a sequence's blocks yields each head's keys contiguous,
ready for a batched matmul without a transpose copy.
"""

from __future__ import annotations

import torch

from executor.config import ModelArgs


class KVCache:
    """K and V for every layer: `data[layer, 0|1]` is [n_kv_heads, num_blocks, block_size, D]."""

    def __init__(self, args: ModelArgs, num_blocks: int, block_size: int,
                 device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(
                f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}"
            )
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Zeros, not empty: masked keys are multiplied by 0 and must be finite (0 * nan = nan).
        shape = (args.n_layers, 2, args.n_kv_heads, num_blocks, block_size, args.head_dim)
        self.data = torch.zeros(shape, device=device, dtype=dtype)

    @property
    def num_bytes(self) -> int:
        return self.data.numel() * self.data.element_size()

    def layer(self, index: int) -> torch.Tensor:
        """One layer's K heads then V heads: [2 * n_kv_heads, num_blocks, block_size, D]."""
        two, heads, blocks, size, dim = self.data.shape[1:]
        return self.data[index].view(two * heads, blocks, size, dim)


def write_kv(cache: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Store k and v [T, n_kv_heads, D] at slots [T] of one layer's cache (KVCache.layer)."""
    heads2, blocks, size, dim = cache.shape
    heads = heads2 // 2
    flat = cache.view(heads2, blocks * size, dim)  # [2 * Hkv, num_slots, D]
    flat[:heads].index_copy_(1, slots, k.transpose(0, 1))
    flat[heads:].index_copy_(1, slots, v.transpose(0, 1))
