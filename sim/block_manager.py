"""Paged KV-cache block accounting: a free list and one block table per request.

The BlockManager owns block ids only; the executor's KV tensors are indexed by them, so the
scheduler and the executor share one source of truth for where each token's KV lives.
"""

from __future__ import annotations


class OutOfBlocksError(RuntimeError):
    """Raised when an allocation is attempted without enough free blocks."""


class BlockManager:
    """Allocates fixed-size KV blocks to requests and frees them, conserving the pool."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # A stack: the most recently freed block is reused first (warm in cache).
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._tables: dict[str, list[int]] = {}

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of the pool in use, 0..1."""
        return (self.num_blocks - len(self._free)) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold num_tokens tokens of KV."""
        return -(-num_tokens // self.block_size)

    def num_missing(self, request_id: str, num_tokens: int) -> int:
        """Blocks that must be added to request_id's table to hold num_tokens tokens."""
        table = self._tables.get(request_id)
        have = len(table) if table is not None else 0
        return max(0, -(-num_tokens // self.block_size) - have)

    def allocate(self, request_id: str, num_tokens: int) -> None:
        """Grow request_id's table to hold num_tokens tokens; raise if the pool is short."""
        if not self.try_allocate(request_id, num_tokens):
            missing = self.num_missing(request_id, num_tokens)
            raise OutOfBlocksError(
                f"request {request_id}: needs {missing} more blocks, {len(self._free)} free"
            )

    def try_allocate(self, request_id: str, num_tokens: int) -> bool:
        """Like allocate, but return False and change nothing if the pool is short."""
        table = self._tables.get(request_id)
        missing = -(-num_tokens // self.block_size) - (len(table) if table is not None else 0)
        if missing <= 0:
            return True
        free = self._free
        if missing > len(free):
            return False
        if table is None:
            table = self._tables[request_id] = []
        table.extend(free[:-missing - 1:-1])  # the top of the stack first, as pops would
        del free[-missing:]
        return True

    def free(self, request_id: str) -> None:
        """Return all of request_id's blocks to the pool; raise if it holds none."""
        table = self._tables.pop(request_id, None)
        if table is None:
            raise KeyError(f"request {request_id} holds no blocks (double free?)")
        self._free.extend(reversed(table))

    def holds(self, request_id: str) -> bool:
        return request_id in self._tables

    def block_table(self, request_id: str) -> list[int]:
        """The ordered block ids holding request_id's KV: token t lives in table[t // size]."""
        return self._tables[request_id]
