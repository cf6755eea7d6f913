"""Eviction mechanisms (`--preemption`): what becomes of a preempted request's KV.

The waiting queue names the victim (sim.engine.queues); the scheduler takes it out of the running
batch and puts it back at the front of the queue; the mechanism decides where its KV goes:
- recompute: the KV is dropped (its full blocks stay in the prefix cache, where it may find
  them again) and the request computes its whole sequence again when it is readmitted;
- swap: the KV is copied to a host pool and back when the request is readmitted (vLLM's
  swap space), falling back to recompute while the host pool is full.
"""

from __future__ import annotations

from collections.abc import Callable

from sim.engine.block_manager import BlockManager
from sim.engine.core import BatchPlan, Request


class RecomputeEviction:
    """Drop the victim's KV; it is recomputed when the request runs again."""

    allows_fast_forward = True  # keeps no per-row state a fast-forwarded row would miss
    num_swapped_out = 0  # preemptions that kept the victim's KV in host memory

    def __init__(self, block_manager: BlockManager) -> None:
        self.block_manager = block_manager

    # Called when a new step is being planned (the last one ran); None: nothing to do.
    before_step: Callable[[], None] | None = None

    def evict(self, victim: Request, plan: BatchPlan) -> None:
        """Free the victim's KV, so that its next admission starts from what the prefix
        cache still holds."""
        bm, computed = self.block_manager, victim.num_computed_tokens
        if bm.enable_caching:  # its recompute may find the blocks it computed
            bm.cache_blocks(victim, computed, own=True)
        bm.free(victim.request_id)
        victim.num_computed_tokens = 0

    def holds(self, request: Request) -> bool:  # noqa: ARG002 - the same signature as swap's
        """Whether the request's KV waits in host memory (never, here)."""
        return False

    def restore(self, request: Request, num_tokens: int, plan: BatchPlan) -> bool:
        """Bring a held request's KV back with room for num_tokens (swap only)."""
        raise RuntimeError(f"request {request.request_id}: recompute keeps no KV to restore")


class SwapEviction(RecomputeEviction):
    """Copy the victim's KV to host memory while the host pool has room, else recompute."""

    allows_fast_forward = False  # a plan's swap lists are per row

    def __init__(self, block_manager: BlockManager) -> None:
        super().__init__(block_manager)
        self.num_swapped_out = 0

    def before_step(self) -> None:  # type: ignore[override] - (the hook)
        self.block_manager.settle_swaps()  # the host blocks the last step read are free

    def evict(self, victim: Request, plan: BatchPlan) -> None:
        bm, computed = self.block_manager, victim.num_computed_tokens
        if not (computed and bm.can_swap_out(computed)):
            super().evict(victim, plan)
            return
        plan.swap_out.append((victim.request_id, *bm.swap_out(victim.request_id, computed)))
        plan.swap_tokens += computed
        self.num_swapped_out += 1

    def holds(self, request: Request) -> bool:
        return self.block_manager.holds_swapped(request.request_id)

    def restore(self, request: Request, num_tokens: int, plan: BatchPlan) -> bool:
        """Give the request a device table for num_tokens and copy its KV back before this
        step's forward; False (nothing done) when the pool is short."""
        moved = self.block_manager.swap_in(request.request_id, num_tokens)
        if moved is None:
            return False
        plan.swap_in.append((request.request_id, *moved))
        plan.swap_tokens += request.num_computed_tokens
        return True


# --preemption name -> mechanism; a new one is a class here and a line in this table.
EVICTIONS: dict[str, type[RecomputeEviction]] = {
    "recompute": RecomputeEviction,
    "swap": SwapEviction,
}
