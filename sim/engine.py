"""The engine step, shared by every time driver: schedule -> execute -> wait -> update.

`Engine.step` is the step of the simulator, the cluster, the measured run and the HTTP
server's engine thread; they differ only in the `wait` they pass, that is, in how they let
a step's time pass. `Engine.quiet_step` applies one step of a run priced at once (sim.coast).
Both record the step through `_record`, the one place a StepRecord is made.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, NamedTuple

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
# replays make one per step); only Engine._record calls it, with every field named.
_step_record = partial(tuple.__new__, StepRecord)

# How a driver lets a step's time pass: given the step's start and duration, a generator that
# yields whatever its event loop waits on (SimPy events; nothing on a wall clock) and returns
# when the step began by the driver's clock. Its tokens are stamped at that + duration.
Wait = Callable[[float, float], Generator[Any, Any, float]]


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

    def step(self, now: float, wait: Wait) -> Generator[Any, Any, list[Request] | None]:
        """Plan, execute and apply the step that starts at `now` (a generator: a driver runs
        it with `yield from`, or run_now on a wall clock); wait lets its time pass. Returns
        the requests it finished, None when there was nothing to run."""
        plan = self.schedule(now)
        if plan is None:
            return None
        result = self.backend.execute(plan)
        start_s = yield from wait(now, result.duration_s)
        return self.finish_step(plan, result, start_s)

    def finish_step(self, plan: BatchPlan, result: StepResult, start_s: float) -> list[Request]:
        """Apply a step that ended at start_s + duration: tokens, retirements, a record."""
        finished = self.scheduler.update(plan, result, start_s + result.duration_s)
        for request in finished:
            self.backend.free(request)
        padding = len(plan.padding)  # (the plan's properties, inlined: once per step)
        self._record(start_s, result.duration_s,
                     len(plan.requests) + plan.deferred_decodes + padding,
                     plan.prefill_tokens, plan.decode_seqs, padding, len(plan.preempted))
        return finished

    def quiet_step(self, start_s: float, duration_s: float) -> list[Request]:
        """Apply one quiet step (sim.coast: only deferred decodes, priced ahead) that ran
        from start_s; its new KV blocks were taken at its start. Returns the requests it
        finished (they leave the engine here)."""
        scheduler = self.scheduler
        deferred = scheduler.deferred
        rows = len(deferred.rows)
        end_s = start_s + duration_s
        finished = deferred.update(end_s, scheduler.block_manager.cache_blocks)
        if finished:
            scheduler.finish_deferred(finished, end_s)
            for request in finished:
                self.backend.free(request)
        self._record(start_s, duration_s, rows, 0, rows, 0, 0)
        return finished

    def _record(self, start_s: float, duration_s: float, batch_size: int, prefill_tokens: int,
                decode_seqs: int, padding_rows: int, num_preempted: int) -> None:
        """Record a step that was just applied (the scheduler's state is the step's after)."""
        scheduler = self.scheduler
        num_tokens = prefill_tokens + decode_seqs
        kv_blocks_used = scheduler.block_manager.num_used_blocks
        num_waiting, num_running = len(scheduler.waiting), len(scheduler.running)
        self.steps.append(_step_record((  # StepRecord's fields, in order
            start_s, duration_s, batch_size, num_tokens, prefill_tokens, decode_seqs,
            padding_rows, kv_blocks_used, num_waiting, num_running, num_preempted)))


def run_now(step: Generator[Any, Any, list[Request] | None]) -> list[Request] | None:
    """Run Engine.step on a clock whose wait never yields (a wall clock: the backend's
    execute already took the step's time); its result."""
    try:
        next(step)
    except StopIteration as done:
        return done.value
    raise RuntimeError("a wall-clock wait must not yield")
