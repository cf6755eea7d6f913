"""Paged KV-cache block accounting: a free pool, one block table per request, prefix caching.

The BlockManager owns block ids only; the executor's KV tensors are indexed by them, so the
scheduler and the executor share one source of truth for where each token's KV lives.

With caching on, each full block computed is registered under its content key (chained from
its parent's, sim.engine.block_hashes), blocks are reference-counted and shared by every request
whose prefix matches, and a block no request holds any more stays cached, in an eviction
queue, until a hit takes it back or the pool needs room. Only full blocks are shared, and
only after the step that computed them: a block's KV is never read before it is written.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from sim.engine.block_hashes import block_hashes, num_shareable_blocks
from sim.engine.core import Request


class OutOfBlocksError(RuntimeError):
    """Raised when an allocation is attempted without enough free blocks."""


class BlockManager:
    """Allocates fixed-size KV blocks to requests and frees them, conserving the pool.

    Every block is in exactly one state: fresh (never used, ids >= `_next_fresh`), empty (a
    stack of used blocks without content worth keeping), evictable (cached, no holder;
    least recently freed first, and a request's blocks enter deepest first) or held
    (reference count > 0). Allocation takes empty, then fresh, then evicts.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False,
                 num_host_blocks: int = 0) -> None:
        if num_host_blocks < 0:
            raise ValueError(f"num_host_blocks must be >= 0, got {num_host_blocks}")
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1, got {num_blocks}")
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self._tables: dict[str, list[int]] = {}
        # Requests holding each cached block. A block without a content key has one holder
        # while held (only cached blocks are shared), so its count is not kept.
        self._ref = [0] * num_blocks
        self._key: list = [None] * num_blocks  # content key of each cached block
        self._empty: list[int] = []  # the most recently freed block is reused first
        self._next_fresh = 0
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._cached: dict = {}  # content key -> block
        self._num_keyed: dict[str, int] = {}  # leading blocks of a table that are registered
        # Host memory for swapped-out KV (--preemption swap): free ids and per-request tables.
        self.num_host_blocks = num_host_blocks
        self._host_free = list(range(num_host_blocks - 1, -1, -1))
        self._host_tables: dict[str, list[int]] = {}
        # Host blocks a swap-in of the step being planned reads: free again only once that
        # step ran (settle_swaps), or a swap-out of the same step, copied first, would
        # overwrite them before they are read.
        self._host_reading: list[int] = []

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take: empty, fresh and cached blocks nobody holds."""
        return len(self._empty) + self.num_blocks - self._next_fresh + len(self._evictable)

    @property
    def num_clean_blocks(self) -> int:
        """Free blocks holding no cached content: taking them evicts nothing."""
        return len(self._empty) + self.num_blocks - self._next_fresh

    @property
    def num_used_blocks(self) -> int:
        """Blocks requests hold: taken from the fresh ones, not back in a free state."""
        return self._next_fresh - len(self._empty) - len(self._evictable)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks registered under a content key, held or not."""
        return len(self._cached)

    @property
    def usage(self) -> float:
        """Fraction of the pool held by requests, 0..1 (cached blocks nobody holds are free)."""
        return self.num_used_blocks / self.num_blocks

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
                f"request {request_id}: needs {missing} more blocks, "
                f"{self.num_free_blocks} free"
            )

    def try_allocate(self, request_id: str, num_tokens: int,
                     prefix: Sequence[int] = ()) -> bool:
        """Grow request_id's table to hold num_tokens tokens, starting a new table with the
        cached `prefix` blocks (from `cached_prefix`); False, changing nothing, if short."""
        table = self._tables.get(request_id)
        if not prefix:  # growing (or starting) a table: the per-step path, kept short
            missing = -(-num_tokens // self.block_size) - (len(table) if table else 0)
            if missing <= 0:
                return True
            empty = self._empty
            if missing == 1 and empty and table is not None:  # a decode's next block
                table.append(empty.pop())  # (the top of the empty stack, as _take takes)
                return True
            if missing > len(empty) + self.num_blocks - self._next_fresh + len(self._evictable):
                return False
            if table is None:
                table = self._tables[request_id] = []
            self._take(table, missing)
            return True
        if table is not None:
            raise ValueError(f"request {request_id} already holds blocks; a prefix starts a table")
        missing = -(-num_tokens // self.block_size) - len(prefix)
        ref = self._ref
        revived = sum(1 for block in prefix if ref[block] == 0)  # leave the evictable queue
        if missing > self.num_free_blocks - revived:
            return False
        table = self._tables[request_id] = []
        for block in prefix:
            if ref[block] == 0:
                del self._evictable[block]
            ref[block] += 1
        table.extend(prefix)
        self._num_keyed[request_id] = len(prefix)
        if missing > 0:
            self._take(table, missing)
        return True

    def take_blocks(self, count: int) -> list[int] | None:
        """count free blocks, in the order that many one-block allocations would take them;
        None, taking none, if fewer are free. They join no table: the caller owns them."""
        if count > self.num_free_blocks:
            return None
        blocks: list[int] = []
        self._take(blocks, count)
        return blocks

    def add_blocks(self, request_ids: list[str]) -> bool:
        """One more block for each request in request_ids (one may be listed more than once),
        in order, as that many one-block allocations would give them (a fast-forward run's
        decode rows, sim.engine.fast_forward); False, changing nothing, if the pool is short."""
        blocks = self.take_blocks(len(request_ids))
        if blocks is None:
            return False
        tables = self._tables
        for request_id, block in zip(request_ids, blocks, strict=True):
            tables[request_id].append(block)
        return True

    def _take(self, table: list[int], count: int) -> None:
        """Append count blocks nobody holds to table: empty first, then fresh, then evicted."""
        empty = self._empty
        reuse = min(count, len(empty))
        if reuse:
            table.extend(empty[:-reuse - 1:-1])  # the top of the stack first, as pops would
            del empty[-reuse:]
        fresh = min(count - reuse, self.num_blocks - self._next_fresh)
        if fresh:
            table.extend(range(self._next_fresh, self._next_fresh + fresh))
            self._next_fresh += fresh
        for _ in range(count - reuse - fresh):
            block, _ = self._evictable.popitem(last=False)
            del self._cached[self._key[block]]
            self._key[block] = None
            table.append(block)

    def free(self, request_id: str) -> None:
        """Release all of request_id's blocks; raise if it holds none.

        A block nobody holds any more stays cached if it is registered, else it is empty.
        """
        table = self._tables.pop(request_id, None)
        if table is None:
            raise KeyError(f"request {request_id} holds no blocks (double free?)")
        ref, key, empty, evictable = self._ref, self._key, self._empty, self._evictable
        if not self._num_keyed.pop(request_id, 0):
            # Nothing of it was ever keyed (no cached prefix, no block registered): all of
            # its blocks are empty now.
            empty.extend(reversed(table))
            return
        for block in reversed(table):  # deepest first: evicted before its prefix
            if key[block] is None:  # its one holder leaves
                empty.append(block)
                continue
            ref[block] -= 1
            if ref[block] == 0:
                evictable[block] = None

    def shrink(self, request_id: str, num_tokens: int) -> None:
        """Release request_id's blocks past those holding num_tokens tokens (speculation's
        rejected lookahead); they were never full, so never cached: they are empty now."""
        table = self._tables[request_id]
        keep = -(-num_tokens // self.block_size)
        tail = table[keep:]
        if any(self._key[block] is not None for block in tail):
            raise RuntimeError(f"request {request_id}: shrinking would release cached blocks")
        del table[keep:]
        self._empty.extend(reversed(tail))

    def holds(self, request_id: str) -> bool:
        return request_id in self._tables

    def block_table(self, request_id: str) -> list[int]:
        """The ordered block ids holding request_id's KV: token t lives in table[t // size]."""
        return self._tables[request_id]

    # ---- prefix caching ------------------------------------------------------------------

    def cached_prefix(self, request: Request) -> list[int]:
        """Blocks of the longest cached prefix of request's tokens, leaving at least its
        last token to compute (that step samples the next token); [] with caching off."""
        if not self.enable_caching or not self._cached:
            return []
        limit = (request.num_tokens - 1) // self.block_size
        if not request.num_preemptions:  # only its own recompute can find unshared blocks
            limit = min(limit, num_shareable_blocks(request, self.block_size))
        # All keys at once: every full block of the request is registered once computed.
        keys = block_hashes(request, limit, self.block_size)
        cached = self._cached
        blocks = []
        for j in range(limit):
            block = cached.get(keys[j])
            if block is None:
                break
            blocks.append(block)
        return blocks

    def cache_blocks(self, request: Request, num_tokens: int, own: bool = False) -> None:
        """Register request's blocks that its first num_tokens tokens fill, once computed.

        Blocks with content nobody else can share (num_shareable_blocks) are registered only
        with `own`: when the request is preempted, for its recompute to find them. Left out
        otherwise, they go back empty when freed and never crowd shared blocks out.
        """
        if not self.enable_caching:
            return
        rid = request.request_id
        done = self._num_keyed.get(rid, 0)
        full = num_tokens // self.block_size
        if not own:
            full = min(full, num_shareable_blocks(request, self.block_size))
        if full <= done:
            return
        keys = block_hashes(request, full, self.block_size)
        table = self._tables[rid]
        for j in range(done, full):
            key = keys[j]
            if key not in self._cached:  # the same content computed twice stays private
                block = table[j]
                self._cached[key] = block
                self._key[block] = key
                self._ref[block] = 1  # (its computing request's alone so far)
        self._num_keyed[rid] = full

    # ---- swapping ------------------------------------------------------------------------

    def can_swap_out(self, num_tokens: int) -> bool:
        """Whether host memory has room for num_tokens tokens of KV."""
        return self.blocks_for(num_tokens) <= len(self._host_free)

    def swap_out(self, request_id: str, num_tokens: int) -> tuple[list[int], list[int]]:
        """Move the blocks holding request_id's first num_tokens tokens to host memory and
        free its device table; returns (device blocks, host blocks), pairwise, for the
        executor to copy before the step's forward reuses any of them."""
        count = self.blocks_for(num_tokens)
        if count > len(self._host_free):
            raise OutOfBlocksError(f"request {request_id}: {count} blocks to swap out, "
                                   f"{len(self._host_free)} free in host memory")
        device = self._tables[request_id][:count]
        host = [self._host_free.pop() for _ in range(count)]
        self._host_tables[request_id] = host
        self.free(request_id)
        return device, host

    def holds_swapped(self, request_id: str) -> bool:
        return request_id in self._host_tables

    def swap_in(self, request_id: str, num_tokens: int) -> tuple[list[int], list[int]] | None:
        """Give a swapped-out request a device table for num_tokens tokens and release its
        host blocks; returns (host blocks, device blocks) pairwise, None if the pool is short."""
        if not self.try_allocate(request_id, num_tokens):
            return None
        host = self._host_tables.pop(request_id)
        self._host_reading.extend(host)
        return host, self._tables[request_id][:len(host)]

    def settle_swaps(self) -> None:
        """The planned step ran: the host blocks its swap-ins read are free."""
        self._host_free.extend(reversed(self._host_reading))
        self._host_reading.clear()

    def drop_swapped(self, request_id: str) -> None:
        """Release a swapped-out request's host blocks (it was aborted)."""
        self._host_free.extend(reversed(self._host_tables.pop(request_id)))

    def check(self) -> None:
        """Assert the pool's invariants (tests): every block in exactly one state."""
        owners = [0] * self.num_blocks
        for table in self._tables.values():
            for block in table:
                owners[block] += 1
        held = [b for b in range(self.num_blocks) if owners[b] > 0]
        free = self._empty + list(range(self._next_fresh, self.num_blocks)) + list(self._evictable)
        assert len(set(free)) == len(free), "a block is free twice"
        assert not set(free) & set(held), "a held block is also free"
        assert len(free) + len(held) == self.num_blocks, "a block is lost"
        keyed = [self._key[b] is not None for b in range(self.num_blocks)]
        assert all(owners[b] == self._ref[b] for b in range(self.num_blocks) if keyed[b]), \
            "a cached block's reference count differs from the block tables"
        assert all(owners[b] <= 1 for b in held if not keyed[b]), "an uncached block is shared"
        assert all(self._key[b] is not None for b in self._evictable), "uncached evictable block"
        assert all(self._key[b] == k for k, b in self._cached.items()), "cache map out of sync"
        host = (self._host_free + self._host_reading
                + [b for t in self._host_tables.values() for b in t])
        assert sorted(host) == list(range(self.num_host_blocks)), "a host block is lost"
