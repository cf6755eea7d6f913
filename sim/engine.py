"""The engine step, shared by every time driver: schedule -> execute -> update.

The simulator, the measured run and the HTTP server differ only in how they tell time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.core import Backend, BatchPlan, Request, StepResult
from sim.scheduler import Scheduler

# Columns of one per-step record (see Engine.finish_step), in order.
STEP_COLUMNS = (
    "start_s",  # when the step began
    "duration_s",  # how long it took (predicted or measured)
    "batch_size",  # rows in the forward, padding included
    "num_tokens",  # tokens computed, padding included
    "prefill_tokens",  # prompt/recompute chunk tokens
    "decode_seqs",  # one-token rows, padding included
    "padding_rows",  # static batching: finished rows still computed
    "kv_blocks_used",  # after the step's retirements
    "num_waiting",  # queue length after the step
    "num_running",  # running requests after the step
    "num_preempted",  # evictions decided for this step
)


@dataclass
class Engine:
    """A scheduler and a backend; records one row per executed step."""

    scheduler: Scheduler
    backend: Backend
    steps: list[tuple] = field(default_factory=list)  # rows in STEP_COLUMNS order

    def add(self, request: Request) -> bool:
        """Queue a request; False if it was rejected (it can never fit)."""
        return self.scheduler.add(request)

    def plan(self, now: float) -> tuple[BatchPlan, StepResult] | None:
        """Schedule and execute one step starting at `now`; None when there is nothing to do."""
        plan = self.scheduler.schedule(now)
        if not plan.requests and not plan.padding:  # plan.is_empty, inlined: once per step
            return None
        return plan, self.backend.execute(plan)

    def finish_step(self, plan: BatchPlan, result: StepResult, start_s: float) -> list[Request]:
        """Apply a step that ended at start_s + duration: tokens, retirements, a record."""
        end_s = start_s + result.duration_s
        scheduler = self.scheduler
        finished = scheduler.update(plan, result, end_s)
        for request in finished:
            self.backend.free(request)
        padding = len(plan.padding)  # (the plan's properties, inlined: once per step)
        self.steps.append((
            start_s, result.duration_s, len(plan.requests) + padding,
            plan.prefill_tokens + plan.decode_seqs, plan.prefill_tokens, plan.decode_seqs,
            padding, scheduler.block_manager.num_used_blocks, len(scheduler.waiting),
            len(scheduler.running), len(plan.preempted),
        ))
        return finished
