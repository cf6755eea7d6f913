"""The engine step, shared by every time driver: schedule -> execute -> update.

The simulator, the measured run and the HTTP server differ only in how they tell time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from typing import NamedTuple

from sim.core import Backend, BatchPlan, Request, StepResult
from sim.scheduler import Scheduler


class StepRecord(NamedTuple):
    """One executed step, as the per-step table and the timeline chart read it."""

    start_s: float  # when the step began
    duration_s: float  # how long it took (predicted or measured)
    batch_size: int  # rows in the forward, padding included
    num_tokens: int  # tokens computed, padding included
    prefill_tokens: int  # prompt/recompute chunk tokens
    decode_seqs: int  # one-token rows, padding included
    padding_rows: int  # static batching: finished rows still computed
    kv_blocks_used: int  # after the step's retirements
    num_waiting: int  # queue length after the step
    num_running: int  # running requests after the step
    num_preempted: int  # evictions decided for this step


# A record from the tuple of its fields, without NamedTuple's Python-level __new__ (the
# replays make one per step).
step_record = partial(tuple.__new__, StepRecord)


@dataclass
class Engine:
    """A scheduler and a backend; records one row per executed step."""

    scheduler: Scheduler
    backend: Backend
    steps: list[StepRecord] = field(default_factory=list)

    def add(self, request: Request) -> bool:
        """Queue a request; False if it was rejected (it can never fit)."""
        return self.scheduler.add(request)

    def schedule(self, now: float) -> BatchPlan | None:
        """The next step's plan, scheduled at `now`; None when there is nothing to run."""
        plan = self.scheduler.schedule(now)
        # plan.is_empty, inlined (once per step); a step that only swaps KV out still runs.
        if (not plan.requests and not plan.deferred_decodes and not plan.padding
                and not plan.swap_out):
            return None
        return plan

    def defer_decodes(self) -> bool:
        """Let the scheduler keep decode rows out of the plans (sim.deferred) when the
        backend prices a plan from its totals alone; returns whether it does."""
        if getattr(self.backend, "reads_rows", True):
            return False
        return self.scheduler.defer_decodes()

    def execute(self, plan: BatchPlan) -> StepResult:
        """Run (or price) the plan on the backend."""
        return self.backend.execute(plan)

    def finish_step(self, plan: BatchPlan, result: StepResult, start_s: float) -> list[Request]:
        """Apply a step that ended at start_s + duration: tokens, retirements, a record."""
        end_s = start_s + result.duration_s
        scheduler = self.scheduler
        finished = scheduler.update(plan, result, end_s)
        for request in finished:
            self.backend.free(request)
        padding = len(plan.padding)  # (the plan's properties, inlined: once per step)
        self.steps.append(step_record((
            start_s, result.duration_s, len(plan.requests) + plan.deferred_decodes + padding,
            plan.prefill_tokens + plan.decode_seqs, plan.prefill_tokens, plan.decode_seqs,
            padding, scheduler.block_manager.num_used_blocks, len(scheduler.waiting),
            len(scheduler.running), len(plan.preempted),
        )))
        return finished
