"""Batching policies (`--policy`): who is admitted each step and how many tokens each gets.

A policy plans a step through the scheduler's public steps (SchedulerSteps): schedule the
running requests, admit waiting ones; the scheduler owns the queues and the KV, the waiting
queue the order, the eviction mechanism the victims' KV. Iteration-level policies (Orca)
let requests join and leave every step:
- continuous: whole prompts, KV reserved for prompt + max_new_tokens at admission;
- recompute: whole prompts, KV allocated block by block, evicting when the pool is short;
- chunked: as recompute, with prompts split to fill each step's token budget (Sarathi-Serve:
  decodes first, then running prefills, then new ones).
Static batching (sim.engine.static_padding) runs a batch at a time. A new policy is a class with
BatchingPolicy's methods and a line in sim.engine.scheduler_config.BATCHING.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from sim.engine.core import BatchPlan, FinishReason, Request

if TYPE_CHECKING:  # (types only)
    from sim.engine.block_manager import BlockManager
    from sim.engine.queues import WaitingQueue


class SchedulerSteps(Protocol):
    """What a batching policy may read and call on the scheduler that runs it."""

    running: list[Request]  # in running order (sim.engine.queues: the victim is chosen from it)
    waiting: WaitingQueue
    block_manager: BlockManager

    @property
    def max_num_seqs(self) -> int: ...

    def schedule_running(self, plan: BatchPlan, on_demand: bool) -> int:
        """Schedule the running requests from the step's budget (on_demand: find KV as
        sequences grow, evicting if the pool is short); returns the budget left."""
        ...

    def admit(self, plan: BatchPlan, budget: int, now: float, reserve: bool,
              split: bool) -> None:
        """Admit waiting requests in queue order while slots, budget and KV allow (reserve:
        KV for prompt + max_new_tokens up front; split: a prompt may take a partial chunk)."""
        ...

    def start(self, request: Request, plan: BatchPlan, now: float, cached: int,
              hit: int) -> None:
        """Move a request just taken from the queue into the running batch, with the KV of
        its first `cached` tokens (`hit` of them found in the prefix cache)."""
        ...


class BatchingPolicy(Protocol):
    """Who is admitted each step and how many tokens each request computes."""

    reserves_full: bool  # admission reserves prompt + max_new_tokens (slot-like KV)
    splits_prompts: bool  # a prompt may be computed over several steps
    budgeted: bool  # a step's tokens come from the token budget
    allows_fast_forward: bool  # its decode rows may be kept out of the plans (fast_forward)

    def schedule(self, scheduler: SchedulerSteps, plan: BatchPlan, now: float) -> None:
        """Fill the plan of the step that starts at `now`."""
        ...

    def hold(self, request: Request, reason: FinishReason) -> bool:
        """Whether a request that finished (or was aborted) while running stays in the
        batch, holding its KV, instead of leaving at once."""
        ...

    # The requests a step that ended at `now` hands back, given those that finished
    # (scheduler, finished, now); None: those that finished.
    returned: Callable[[SchedulerSteps, list[Request], float], list[Request]] | None

    @property
    def held_rows(self) -> list[Request]:
        """Finished requests that still hold KV in the batch."""
        ...


class ContinuousBatching:
    """Iteration-level batching of whole prompts, KV reserved up front (slot-like)."""

    reserves_full = True  # admission reserves prompt + max_new_tokens
    splits_prompts = False  # a prompt is computed in one step, so it must fit the budget
    budgeted = True  # a step's tokens come from the token budget
    allows_fast_forward = True  # its decode rows may be kept out of the plans (fast_forward)

    def schedule(self, scheduler: SchedulerSteps, plan: BatchPlan, now: float) -> None:
        """Plan a step: the running requests first, then admissions from what is left."""
        budget = scheduler.schedule_running(plan, not self.reserves_full)
        if scheduler.waiting and not plan.preempted:
            scheduler.admit(plan, budget, now, self.reserves_full, self.splits_prompts)

    def hold(self, request: Request, reason: FinishReason) -> bool:  # noqa: ARG002
        """A finished request leaves at once."""
        return False

    returned = None  # every request that finished in the step

    @property
    def held_rows(self) -> list[Request]:
        """None: no finished request holds KV."""
        return []


class RecomputeBatching(ContinuousBatching):
    """Whole prompts, KV on demand block by block; eviction when the pool runs short."""

    reserves_full = False


class ChunkedBatching(RecomputeBatching):
    """Mixed batches: prompts split into chunks that fill each step's token budget."""

    splits_prompts = True
